"""Reading a written Orbax checkpoint back and comparing it with what was saved.

`verify` checks the checkpoint's Orbax metadata (every leaf present, none
extra, shapes and dtypes as saved), then reads back every array shard this
process holds, through the TensorStore specs Orbax itself reads with
(`ocp.type_handlers.get_json_tspec_read`), and compares it bit for bit with the
in-memory shards. Blocks (whole arrays when this process holds them whole,
else each distinct shard) are read into reused host buffers a budget of bytes
at a time; one batch is compared while the next is read. Nothing is placed on a device and nothing is gathered, so
verifying costs one pass over the data on disk and a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from converters import checkpoints
from converters.allocator import release_free_memory
from converters.errors import VerificationError, format_offenders

# Read back at most this many bytes at a time (two batches are held: one being
# compared while the next is read).
CHUNK_BYTES = 32 * 2**20


@dataclasses.dataclass(frozen=True)
class _Region:
  """A block of one array to read back, and the in-memory shards inside it.

  Attributes:
    leaf: the array's path.
    index: the block, as slices of the array.
    shape, dtype: the block's.
    shards: `(slices within the block, shard data)` of every shard it covers,
      replicas included.
  """

  leaf: tuple[str, ...]
  index: tuple[slice, ...]
  shape: tuple[int, ...]
  dtype: np.dtype
  shards: list[tuple[tuple[slice, ...], jax.Array]]

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape)) * self.dtype.itemsize


def _regions(expected: dict[tuple[str, ...], jax.Array], budget: int) -> list[_Region]:
  """What to read back: each array whole when this process holds all of it and
  it fits in `budget` (one read instead of one per shard), else each distinct
  shard this process holds, once however many replicas it has."""
  out = []
  for leaf, x in expected.items():
    shards = x.addressable_shards
    if x.is_fully_addressable and x.nbytes <= budget:
      whole = tuple(slice(0, n) for n in x.shape)
      out.append(_Region(leaf, whole, x.shape, x.dtype, [(s.index, s.data) for s in shards]))
      continue
    by_index: dict[tuple, _Region] = {}
    for shard in shards:
      key = tuple(s.indices(n) for s, n in zip(shard.index, x.shape))
      if key not in by_index:
        shape = tuple(stop - start for start, stop, _ in key)
        by_index[key] = _Region(leaf, shard.index, shape, x.dtype, [])
      by_index[key].shards.append(((), shard.data))
    out += by_index.values()
  return out


def _batches(regions: Sequence[_Region], budget: int) -> Iterator[list[_Region]]:
  """`regions` in order, grouped so each group holds at most `budget` bytes."""
  group, total = [], 0
  for region in regions:
    if group and total + region.nbytes > budget:
      yield group
      group, total = [], 0
    group.append(region)
    total += region.nbytes
  if group:
    yield group


def _bits(x: np.ndarray) -> np.ndarray:
  """`x` as unsigned integers of its width: NaNs and -0.0 compare by their bits."""
  return x.view(f'u{x.dtype.itemsize}') if x.ndim else x.reshape(1).view(f'u{x.dtype.itemsize}')


def _differs(group: list[_Region], blocks: list[np.ndarray]) -> list[tuple[str, ...]]:
  """The leaves of `group` whose read-back block differs from a shard inside it."""
  return [
      region.leaf for region, block in zip(group, blocks)
      if not all(
          np.array_equal(_bits(block)[within] if within else _bits(block), _bits(np.asarray(data)))
          for within, data in region.shards
      )
  ]


class _Reader:
  """Reads shards of the arrays of one Orbax checkpoint into host buffers."""

  def __init__(self, path: str, names: dict[tuple[str, ...], str], use_zarr3: bool):
    import orbax.checkpoint as ocp
    from etils import epath

    self._ocp = ocp
    self._directory = epath.Path(path)
    self._names = names
    self._use_zarr3 = use_zarr3
    self._context = ocp.type_handlers.get_ts_context(use_ocdbt=True)
    self._stores: dict[tuple[str, ...], Any] = {}

  async def _store(self, leaf: tuple[str, ...]):
    import tensorstore as ts

    if leaf not in self._stores:
      info = self._ocp.type_handlers.ParamInfo(
          name=self._names[leaf], parent_dir=self._directory, is_ocdbt_checkpoint=True,
          use_zarr3=self._use_zarr3, ts_context=self._context,
      )
      spec = self._ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=True)
      self._stores[leaf] = await ts.open(spec, read=True, context=self._context)
    return self._stores[leaf]

  async def read(self, leaf: tuple[str, ...], index: tuple, out: np.ndarray) -> None:
    import tensorstore as ts

    store = await self._store(leaf)
    await ts.array(out).write(store[index])


async def _read_and_compare(reader: _Reader, regions: list[_Region], budget: int) -> list[str]:
  loop = asyncio.get_running_loop()
  arenas = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
  differing: list[tuple[str, ...]] = []
  # One batch is compared on this thread while the next one is read.
  with concurrent.futures.ThreadPoolExecutor(1) as compare:
    pending = None
    for i, group in enumerate(_batches(regions, budget)):
      if arenas[i % 2].nbytes < sum(r.nbytes for r in group):
        arenas[i % 2] = np.empty(sum(r.nbytes for r in group), np.uint8)
      blocks, offset = [], 0
      for region in group:
        block = arenas[i % 2][offset:offset + region.nbytes]
        blocks.append(block.view(region.dtype).reshape(region.shape))
        offset += region.nbytes
      # Every read finishes before an error is raised: TensorStore still
      # calls back into this loop for reads left running.
      results = await asyncio.gather(*(
          reader.read(region.leaf, region.index, block) for region, block in zip(group, blocks)
      ), return_exceptions=True)
      failed = [(r.leaf, e) for r, e in zip(group, results) if isinstance(e, Exception)]
      if failed:
        if pending is not None:
          await pending
        leaves = list(dict.fromkeys('/'.join(leaf) for leaf, _ in failed))
        raise VerificationError(
            f'what was written cannot be read back at [{format_offenders(leaves)}]: '
            f'{checkpoints.reason(failed[0][1])}',
            leaves,
        ) from failed[0][1]
      # TensorStore's decoding buffers, freed in many threads' arenas.
      release_free_memory()
      if pending is not None:
        differing += await pending
      pending = loop.run_in_executor(compare, _differs, group, blocks)
    if pending is not None:
      differing += await pending
  return ['/'.join(leaf) for leaf in dict.fromkeys(differing)]


def verify(path: str, expected: Any, chunk_bytes: int = CHUNK_BYTES) -> int:
  """Reads the Orbax checkpoint at `path` back and compares it with `expected`.

  Args:
    path: an Orbax checkpoint just saved from `expected`.
    expected: the saved pytree of `jax.Array`s.
    chunk_bytes: how much to read back at a time.

  Returns:
    The number of leaves compared.

  Raises:
    VerificationError: listing every leaf that is missing, extra, of another
      shape or dtype, unreadable or different.
  """
  import orbax.checkpoint as ocp

  flat = {
      checkpoints.string_path(k): v
      for k, v in jax.tree_util.tree_flatten_with_path(expected)[0]
  }
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      metadata = checkpointer.metadata(path).item_metadata
    if metadata is None:  # Orbax logs why and returns None
      raise ValueError('Orbax found no item metadata')
  except Exception as e:  # Orbax raises many types for unreadable metadata
    raise VerificationError(
        f'{path}: what was written cannot be read back: its Orbax metadata: '
        f'{checkpoints.reason(e)}'
    ) from e
  written = {
      checkpoints.string_path(k): v
      for k, v in jax.tree_util.tree_flatten_with_path(metadata.tree)[0]
  }
  # Orbax's name of each array in the checkpoint (its empty states get one too).
  names = {
      checkpoints.string_path(k): name
      for k, name in jax.tree_util.tree_flatten_with_path(
          ocp.tree.get_param_names(metadata.tree)
      )[0]
  }
  offenders = [
      '/'.join(p) for p, x in flat.items()
      if p not in written
      or (tuple(written[p].shape), np.dtype(written[p].dtype)) != (x.shape, x.dtype)
  ]
  offenders += sorted('/'.join(p) for p in written.keys() - flat.keys())
  if not offenders:
    reader = _Reader(path, names, metadata.use_zarr3)
    work = _read_and_compare(reader, _regions(flat, chunk_bytes), chunk_bytes)
    # A thread of its own, so this works under a running event loop (notebooks).
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
      try:
        offenders = thread.submit(asyncio.run, work).result()
      except VerificationError as e:
        raise VerificationError(f'{path}: {e}', e.paths) from e
  if offenders:
    raise VerificationError(
        f'{path}: what was written differs from what was converted at '
        f'[{format_offenders(offenders)}]; the disk or Orbax lost data, '
        'so nothing was moved into place',
        offenders,
    )
  return len(flat)
