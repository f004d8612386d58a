"""Reading a written Orbax checkpoint back and comparing it with what was saved.

`verify` checks the checkpoint's Orbax metadata (every leaf present, none
extra, shapes and dtypes as saved), then reads back every array shard this
process holds, through the TensorStore specs Orbax itself reads with
(`ocp.type_handlers.get_json_tspec_read`), and compares it bit for bit with the
in-memory shards. Blocks (whole arrays when this process holds them whole,
else each distinct shard) are read concurrently, at most a budget of bytes at
a time, and each is compared as soon as it arrives. Nothing is placed on a
device and nothing is gathered, so verifying costs one pass over the data on
disk and a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from typing import Any

import jax
import numpy as np

from converters.allocator import release_free_memory
from converters.checkpoint import inspect as checkpoints
from converters.comparison import as_key_data, host_bits
from converters.errors import CheckpointError, VerificationError, format_offenders

# Read back at most this many bytes at a time.
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


def _matches(region: _Region, block: np.ndarray) -> bool:
  """Whether every in-memory shard inside `region` equals `block`, bit for bit."""
  bits = host_bits(block)
  return all(
      np.array_equal(bits[within] if within else bits, host_bits(data))
      for within, data in region.shards
  )


class _Reader:
  """Opens the arrays of one Orbax checkpoint, each once, and reads blocks of them."""

  def __init__(self, path: str, names: dict[tuple[str, ...], str], use_zarr3: bool):
    import orbax.checkpoint as ocp
    import tensorstore as ts
    from etils import epath

    self._ocp = ocp
    self._directory = epath.Path(path)
    self._names = names
    self._use_zarr3 = use_zarr3
    # Orbax's context caches up to 100 MB of OCDBT reads; a read-back reads
    # each chunk once, so it caches nothing.
    self._context = ts.Context(
        ts.Context.Spec({'cache_pool#ocdbt': {'total_bytes_limit': 0}}),
        ocp.type_handlers.get_ts_context(use_ocdbt=True),
    )
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

  async def read(self, leaf: tuple[str, ...], index: tuple) -> np.ndarray:
    store = await self._store(leaf)
    return await store[index].read()


async def _read_and_compare(reader: _Reader, regions: list[_Region], budget: int) -> list[str]:
  """Reads `regions` in order, at most `budget` bytes at once (a larger region
  alone), and compares each as it arrives; the leaves that differ."""

  async def check(region: _Region) -> bool:
    return _matches(region, await reader.read(region.leaf, region.index))

  running: dict[asyncio.Task, int] = {}
  done: list[tuple[_Region, asyncio.Task]] = []
  released = 0
  for region in regions:
    while running and sum(running.values()) + region.nbytes > budget:
      finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
      for task in finished:
        released += running.pop(task)
    # TensorStore decodes in several threads, whose arenas would each keep
    # the blocks they freed: hand them back every few budgets.
    if released >= 4 * budget:
      released = 0
      release_free_memory()
    task = asyncio.ensure_future(check(region))
    running[task] = region.nbytes
    done.append((region, task))
  # Every read finishes before an error is raised: TensorStore would still
  # call back into this loop for reads left running.
  await asyncio.gather(*running, return_exceptions=True)
  release_free_memory()
  failed = [(r.leaf, t.exception()) for r, t in done if t.exception() is not None]
  if failed:
    leaves = list(dict.fromkeys('/'.join(leaf) for leaf, _ in failed))
    raise VerificationError(
        f'what was written cannot be read back at [{format_offenders(leaves)}]: '
        f'{checkpoints.reason(failed[0][1])}',
        leaves,
    ) from failed[0][1]
  return list(dict.fromkeys('/'.join(r.leaf) for r, t in done if not t.result()))


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
      checkpoints.string_path(k): as_key_data(v)
      for k, v in jax.tree_util.tree_flatten_with_path(expected)[0]
  }
  try:
    metadata = checkpoints.orbax_metadata(path)
  except CheckpointError as e:
    raise VerificationError(f'what was written cannot be read back: {e}') from e
  written = checkpoints.leaves_of(metadata.tree)
  # Orbax's name of each array in the checkpoint (its empty states get one too).
  names = {
      checkpoints.string_path(k): name
      for k, name in jax.tree_util.tree_flatten_with_path(
          ocp.tree.get_param_names(metadata.tree)
      )[0]
  }
  offenders = [
      '/'.join(p) for p, x in flat.items()
      if written.get(p) != (x.shape, str(x.dtype))
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
