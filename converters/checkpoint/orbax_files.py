"""The files of an Orbax checkpoint, read and written array by array and chunk by chunk.

An Orbax checkpoint (`StandardCheckpointer`, 0.12) is a TensorStore key-value
store (OCDBT, written per process under `ocdbt.process_N/` and merged at the
root) holding one zarr array per leaf, plus JSON files: `_METADATA` (the tree),
`_sharding`, `array_metadatas/process_N` and `_CHECKPOINT_METADATA`. Every
array is stored chunk by chunk, each chunk one key (`NAME/i.j.k`) whose value
is the chunk encoded by the array's codec (zstd by default).

`SourceCheckpoint` reads such a checkpoint (or a `flax.training.checkpoints`
msgpack file, whose arrays are on the host already) one chunk or one region at
a time: a chunk as its encoded bytes (to move it without decoding), a region
decoded. `CheckpointWriter` writes one: an array's zarr metadata, encoded
chunks as they are, decoded regions (encoded by TensorStore), then the JSON
files, built with Orbax's own metadata classes so that the ordinary
`StandardCheckpointer.restore` (and `metadata`) read it like one Orbax wrote.
It knows nothing of models: which chunk goes where is the caller's plan
(`converters.checkpoint.streaming`).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from converters import compat
from converters.checkpoint.inspect import CheckpointInfo, reason, string_path
from converters.errors import CheckpointError
from converters.relayout_ops import Region

Leaf = tuple[str, ...]

_ZARR2 = '.zarray'
# What a chunk moved as bytes must share with the array it moves into.
_CODEC_FIELDS = ('compressor', 'dtype', 'fill_value', 'filters', 'order', 'zarr_format')


def run_coroutine(work) -> Any:
  """Runs a coroutine on an event loop of its own thread (so it also works
  under a running loop: notebooks)."""
  with concurrent.futures.ThreadPoolExecutor(1) as thread:
    return thread.submit(asyncio.run, work).result()


def _async_io() -> tuple[Any, Any]:
  import orbax.checkpoint as ocp
  import tensorstore as ts

  return ocp, ts


def _orbax_context(**resources: dict) -> Any:
  """Orbax's TensorStore context without its B-tree node cache (100 MB), with
  `resources` on top. Reading chunk by chunk or writing a database key by key
  would fill that cache as the checkpoint grows, and memory with it."""
  ocp, ts = _async_io()
  return ts.Context(
      ts.Context.Spec({**resources, 'cache_pool#ocdbt': {'total_bytes_limit': 0}}),
      ocp.type_handlers.get_ts_context(use_ocdbt=True),
  )


@dataclasses.dataclass(frozen=True)
class StoredArray:
  """One array of a checkpoint as stored.

  Attributes:
    name: Orbax's name of the array (its keys' prefix).
    shape: its shape as stored (a PRNG key array as its key data).
    dtype: its dtype as stored.
    chunks: its chunk shape.
    zarr: its zarr v2 metadata when its chunks are keys that can be moved as
      bytes; None when they cannot (zarr v3, a msgpack file).
  """

  name: str
  shape: tuple[int, ...]
  dtype: np.dtype
  chunks: tuple[int, ...]
  zarr: Mapping[str, Any] | None = None

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape)) * self.dtype.itemsize

  def stored(self) -> tuple[tuple[int, ...], np.dtype] | None:
    """Shape and dtype as its zarr metadata records them (None without it)."""
    if self.zarr is None:
      return None
    return tuple(self.zarr['shape']), np.dtype(self.zarr['dtype'])

  def codec(self) -> tuple | None:
    """What chunks moved as bytes must agree on, or None if they cannot be."""
    if self.zarr is None:
      return None
    return tuple(json.dumps(self.zarr.get(f), sort_keys=True) for f in _CODEC_FIELDS) + (
        self.zarr.get('dimension_separator', '.'),
    )


def chunk_grid(shape: Sequence[int], chunks: Sequence[int]) -> tuple[int, ...]:
  """How many chunks each dimension has."""
  return tuple(-(-n // c) if c else 0 for n, c in zip(shape, chunks))


def chunk_region(shape: Sequence[int], chunks: Sequence[int], index: Sequence[int]) -> Region:
  """The region of the array chunk `index` covers (clipped at the edges)."""
  return tuple(
      (i * c, min((i + 1) * c, n)) for i, c, n in zip(index, chunks, shape)
  )


def chunk_key(array: StoredArray, index: Sequence[int]) -> bytes:
  """The key of one chunk of a zarr v2 array (a scalar's only chunk is `0`)."""
  separator = (array.zarr or {}).get('dimension_separator', '.')
  return f'{array.name}/{separator.join(map(str, index)) if index else "0"}'.encode()


def _slices(region: Region) -> tuple[slice, ...]:
  return tuple(slice(a, b) for a, b in region)


def listed_arrays(path: str) -> list[Leaf]:
  """The arrays an Orbax checkpoint's `_METADATA` lists, empty nodes left out.

  Parsed by Orbax's own tree metadata class; opens no array (Orbax's
  `metadata()` opens every one to read its shape, which `SourceCheckpoint`
  reads from the same zarr metadata).
  """
  orbax = compat.orbax_internals()
  with open(os.path.join(path, '_METADATA')) as f:
    content = orbax.tree_metadata.InternalTreeMetadata.from_json(json.load(f))
  return [
      tuple(str(k.nested_key_name) for k in entry.key_metadata.nested_key_metadata_entries)
      for entry in content.tree_metadata_entries
      if not orbax.empty_values.is_empty_typestr(entry.value_metadata.value_type)
  ]


def _is_ocdbt(path: str) -> bool:
  return os.path.exists(os.path.join(path, 'manifest.ocdbt'))


class SourceCheckpoint:
  """Reads the arrays of a checkpoint, chunk by chunk or region by region.

  Call `open` (a coroutine) first. Nothing is read until asked for, and
  decoded chunks are cached up to `cache_bytes` (a region that slices one
  layer out of a chunk holding several reads the chunk once for all).
  """

  def __init__(self, info: CheckpointInfo, cache_bytes: int = 0):
    self.info = info
    self.arrays: dict[Leaf, StoredArray] = {}
    self._cache_bytes = cache_bytes
    self._host: dict[Leaf, np.ndarray] = {}
    self._stores: dict[Leaf, Any] = {}
    self._kvstore = None
    self._context = None
    self._use_zarr3 = False

  async def open(self) -> None:
    info = self.info
    if info.format == 'flax-msgpack':
      for keypath, value in jax.tree_util.tree_flatten_with_path(info.host_tree)[0]:
        array = np.asarray(value)
        leaf = string_path(keypath)
        self._host[leaf] = array
        self.arrays[leaf] = StoredArray('/'.join(leaf), array.shape, array.dtype, array.shape)
      return
    ocp, ts = _async_io()
    self._use_zarr3 = info.use_zarr3
    names = {
        string_path(k): name
        for k, name in jax.tree_util.tree_flatten_with_path(ocp.tree.get_param_names(info.tree))[0]
    }
    self._context = _orbax_context(cache_pool={'total_bytes_limit': self._cache_bytes})
    base = {'driver': 'file', 'path': info.path.rstrip('/') + '/'}
    spec = {'driver': 'ocdbt', 'base': base} if _is_ocdbt(info.path) else base
    try:
      self._kvstore = await ts.KvStore.open(spec, context=self._context)
      described = await asyncio.gather(*(self._describe(leaf, names[leaf]) for leaf in info.leaves))
    except CheckpointError:
      raise
    except Exception as e:  # TensorStore raises several types for bad data
      raise CheckpointError(
          f'{info.path}: the checkpoint is corrupted or incomplete; reading its '
          f'array metadata failed: {reason(e)}'
      ) from e
    self.arrays = dict(zip(info.leaves, described))

  async def _describe(self, leaf: Leaf, name: str) -> StoredArray:
    shape, dtype = self.info.leaves[leaf]
    if not self._use_zarr3:  # its metadata says its chunks: no array is opened yet
      found = await self._kvstore.read(f'{name}/{_ZARR2}'.encode())
      if found.state == 'value':
        zarr = json.loads(found.value)
        return StoredArray(name, tuple(shape), np.dtype(dtype), tuple(zarr['chunks']), zarr)
    store = await self._store(leaf, name)  # zarr v3 (or metadata Orbax's reader finds elsewhere)
    chunks = tuple(store.chunk_layout.read_chunk.shape or shape)
    return StoredArray(name, tuple(shape), np.dtype(dtype), chunks)

  async def _store(self, leaf: Leaf, name: str):
    ocp, ts = _async_io()
    from etils import epath

    if leaf not in self._stores:
      param = ocp.type_handlers.ParamInfo(
          name=name, parent_dir=epath.Path(self.info.path),
          is_ocdbt_checkpoint=_is_ocdbt(self.info.path), use_zarr3=self._use_zarr3,
          ts_context=self._context,
      )
      spec = ocp.type_handlers.get_json_tspec_read(param, use_ocdbt=param.is_ocdbt_checkpoint)
      self._stores[leaf] = await ts.open(spec, read=True, context=self._context)
    return self._stores[leaf]

  def extension_metadata(self) -> dict[Leaf, dict | None]:
    """Orbax's extra metadata of each array (a PRNG key's implementation)."""
    if self.info.format != 'orbax':
      return {}
    from etils import epath

    try:
      found = run_coroutine(compat.orbax_internals().array_metadata_store.Store().read(epath.Path(self.info.path), process_index=0))
    except Exception:  # older checkpoints have none
      return {}
    by_name = {m.param_name: m.ext_metadata for m in found or []}
    return {leaf: by_name.get(a.name) for leaf, a in self.arrays.items()}

  async def read_chunks(self, chunks: Sequence[tuple[Leaf, Sequence[int]]]) -> list[bytes]:
    """The encoded bytes of several chunks, read together: one coroutine
    awaiting many TensorStore reads costs a fraction of one per chunk."""
    keys = [chunk_key(self.arrays[leaf], index) for leaf, index in chunks]
    found = await asyncio.gather(*(self._kvstore.read(key) for key in keys))
    for (leaf, _), key, value in zip(chunks, keys, found):
      if value.state != 'value':
        raise CheckpointError(
            f'{self.info.path}: the checkpoint is corrupted or incomplete: chunk '
            f'{key.decode()} of {"/".join(leaf)} is missing',
            ['/'.join(leaf)],
        )
    return [value.value for value in found]

  async def read(self, leaf: Leaf, region: Region) -> np.ndarray:
    """One region of an array, decoded."""
    if leaf in self._host:
      return self._host[leaf][_slices(region)]
    store = await self._store(leaf, self.arrays[leaf].name)
    return await store[_slices(region)].read()


class CheckpointWriter:
  """Writes an Orbax checkpoint into the new directory `path`.

  Each process writes the chunks it is given into its own OCDBT database
  (`ocdbt.process_N`), as Orbax does; `merge` (the first process, once every
  process has closed its writer) joins them at the root, and
  `write_metadata` writes the JSON files. Call `open` (a coroutine) first.
  """

  def __init__(self, path: str, process_index: int = 0):
    self.path = os.path.abspath(path)
    self.process_index = process_index
    self._kvstore = None
    self._context = _orbax_context()  # its B-tree cache grew by 60-100 MiB at 7.7 GiB
    self._arrays: dict[str, Any] = {}  # opened for region writes, by name

  def _kvstore_spec(self) -> dict:
    tensorstore_utils = compat.orbax_internals().tensorstore_utils
    return tensorstore_utils.build_kvstore_tspec(
        self.path, use_ocdbt=True,
        ocdbt_process_spec=tensorstore_utils.OcdbtProcessSpec(process_id=str(self.process_index)),
        ocdbt_write_options=tensorstore_utils.OcdbtKvStoreWriteOptions(
            mode=tensorstore_utils.OcdbtWriteMode.WRITE
        ),
    )

  async def open(self) -> None:
    _, ts = _async_io()
    self._kvstore = await ts.KvStore.open(self._kvstore_spec(), context=self._context)

  @staticmethod
  def zarr_metadata(
      shape: Sequence[int], dtype: np.dtype, chunks: Sequence[int], like: Mapping | None = None
  ) -> dict:
    """The zarr v2 metadata of a new array: `like`'s codec when given (so its
    chunks can be moved as bytes), else the codec Orbax writes with."""
    if like is None:
      dtype = np.dtype(dtype)
      orbax, _, _ = compat.orbax_internals().tensorstore_utils._build_zarr_shard_and_chunk_metadata(  # Orbax's own choice
          global_shape=tuple(shape), shard_shape=tuple(chunks), use_compression=True,
          use_zarr3=False, chunk_shape=tuple(chunks),
      )
      like = {'zarr_format': 2, 'dimension_separator': '.', 'filters': None, 'fill_value': None,
              'order': 'C', **orbax,
              # TensorStore's zarr v2 names: NumPy's, and the ml_dtypes (bfloat16) by name.
              'dtype': dtype.name if dtype.kind == 'V' else dtype.str}
    return {**like, 'shape': list(shape), 'chunks': list(chunks)}

  async def create(self, array: StoredArray) -> None:
    """Writes the zarr metadata of `array` (`array.zarr`); once per array,
    whichever process writes its chunks."""
    await self._kvstore.write(f'{array.name}/{_ZARR2}'.encode(), json.dumps(array.zarr).encode())

  def write_chunks(self, chunks: Sequence[tuple[StoredArray, Sequence[int], bytes]]) -> Awaitable[Any]:
    """Starts writing encoded chunks as they are, together; returns what to
    await for them to be written. TensorStore copies each chunk's bytes as
    its write starts: the caller's can go at once."""
    return asyncio.gather(*(self._kvstore.write(chunk_key(a, i), data) for a, i, data in chunks))

  async def write(self, array: StoredArray, region: Region, values: np.ndarray) -> Awaitable[Any]:
    """Starts writing a region of `array` (whole chunks), encoded by
    TensorStore; returns what to await for it to be written. TensorStore
    keeps `values` until it has copied them, then lets them go."""
    _, ts = _async_io()
    store = self._arrays.get(array.name)
    if store is None:  # once per array, not per region
      store = self._arrays[array.name] = await ts.open(
          {'driver': 'zarr', 'kvstore': {**self._kvstore_spec(), 'path': f'{array.name}/'},
           'metadata': dict(array.zarr), 'recheck_cached_metadata': False,
           'recheck_cached_data': False},
          # Another process's database holds the metadata written by `create`:
          # this one's gets the same (the merge keeps one of identical values).
          open=True, create=True, context=self._context,
      )
    return store[_slices(region)].write(values)

  async def close(self) -> None:
    self._kvstore = None
    self._arrays.clear()

  def merge(self) -> None:
    """Joins every process's database at the root (the first process, once all are written)."""
    ocp, _ = _async_io()
    from etils import epath

    run_coroutine(ocp.type_handlers.merge_ocdbt_per_process_files(
        epath.Path(self.path), ts_context=ocp.type_handlers.get_ts_context(use_ocdbt=True),
        use_zarr3=False,
    ))

  def write_metadata(
      self, tree: Any, arrays: Mapping[Leaf, StoredArray], ext: Mapping[Leaf, dict | None]
  ) -> None:
    """The JSON files, as Orbax writes them for `tree` (the abstract target,
    with shardings): tree metadata, shardings, array metadata, step metadata."""
    ocp, _ = _async_io()
    from etils import epath

    orbax = compat.orbax_internals()
    directory = epath.Path(self.path)
    names = ocp.tree.get_param_names(tree)

    def param_info(keypath, name, value):
      if hasattr(value, 'shape'):
        typestr, write_shape = 'jax.Array', arrays[string_path(keypath)].chunks
      else:  # an empty node (an optax EmptyState): typed as Orbax types it
        typestr, write_shape = orbax.type_handler_registry.get_param_typestr(
            value, orbax.type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY,
            orbax.tree_metadata.PYTREE_METADATA_OPTIONS,
        ), None
      return ocp.type_handlers.ParamInfo(
          name=name, keypath=keypath, parent_dir=directory, is_ocdbt_checkpoint=True,
          use_zarr3=False, value_typestr=typestr, write_shape=write_shape,
          ts_context=self._context,
      )

    infos = jax.tree.map_with_path(param_info, names, tree, is_leaf=ocp.utils.is_empty_or_leaf)
    content = orbax.tree_metadata.InternalTreeMetadata.build(infos, use_ocdbt=True, use_zarr3=False)
    _write_json(os.path.join(self.path, '_METADATA'), content.to_json())
    shardings, described = {}, []
    for keypath, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
      leaf = string_path(keypath)
      array = arrays[leaf]
      # An array without one is on one device, as Orbax records an uncommitted array.
      sharding = getattr(value, 'sharding', None) or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      key = base64.urlsafe_b64encode(array.name.encode()).decode('utf-8')
      shardings[key] = orbax.sharding_metadata.from_jax_sharding(sharding).to_serialized_string()
      described.append(orbax.array_metadata.ArrayMetadata(
          param_name=array.name, shape=array.shape, dtype=array.dtype,
          write_shape=array.chunks, chunk_shape=array.chunks, use_ocdbt=True, use_zarr3=False,
          ext_metadata=ext.get(leaf),
      ))
    _write_json(os.path.join(self.path, '_sharding'), shardings)
    run_coroutine(orbax.array_metadata_store.Store().write(directory, described, process_index=0))
    handler = ocp.StandardCheckpointHandler
    now = time.time_ns()
    _write_json(
        os.path.join(self.path, '_CHECKPOINT_METADATA'),
        orbax.step_metadata_serialization.serialize(ocp.metadata.StepMetadata(
            item_handlers=f'{handler.__module__}.{handler.__qualname__}',
            init_timestamp_nsecs=now, commit_timestamp_nsecs=now,
        )),
    )


def _write_json(path: str, content: Any) -> None:
  with open(path, 'w') as f:
    json.dump(content, f)
    f.flush()
    os.fsync(f.fileno())
