"""Converting a checkpoint from disk to disk, chunk by chunk, within a memory budget.

`write` carries out the recipes of a conversion (`converters.checkpoint.recipes`)
from the source checkpoint's files to a new Orbax checkpoint
(`converters.checkpoint.orbax_files`) without placing anything on a device:

- a chunk whose data does not change moves as its encoded bytes, never
  decoded: every chunk of a same-layout conversion, each layer's chunks when
  looped layers are stacked, and each layer's chunks when a stack whose chunks
  hold one layer each is sliced;
- everything else (a slice of chunks that hold several layers, a cast
  counter, a rule's transform, a seeded RNG key) is read decoded, computed on
  the host and written region by region, encoded by TensorStore.

The target keeps the source's chunks, with one layer per chunk along a
stacked axis: a later relayout of what it writes moves bytes again. Arrays it
computes are chunked by their shards, as Orbax chunks them, split further
when a chunk would take more than an eighth of the budget.

At most `memory_budget` bytes of chunk data are held at once (a chunk larger
than the budget is moved alone); moved chunks go in batches (one TensorStore
call awaited per chunk would cost more than its bytes). Every chunk written
is recorded with the CRC-32 of its bytes (encoded when moved, decoded when
computed); `verify` reads the written checkpoint back through a fresh
TensorStore context and compares each chunk's checksum, the tree its
`_METADATA` lists and each array's shape and dtype with the target's. With
several processes, each moves a contiguous share of the chunks into its own
database (`ocdbt.process_N`) and verifies its own share.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import zlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import jax
import numpy as np

from converters import compat, relayout_ops
from converters.allocator import release_free_memory
from converters.checkpoint import inspect as checkpoints
from converters.checkpoint.orbax_files import (
    CheckpointWriter,
    Region,
    SourceCheckpoint,
    StoredArray,
    chunk_grid,
    chunk_region,
    listed_arrays,
    run_coroutine,
)
from converters.checkpoint.recipes import Constant, Made, Recipe, Stored
from converters.errors import CheckpointError, VerificationError, format_offenders

Leaf = tuple[str, ...]

DEFAULT_MEMORY_BUDGET = 2**30
# The share of the budget that caches decoded source chunks, so that slicing
# one layer at a time out of chunks that hold several layers reads each once.
CACHE_SHARE = 4


@dataclasses.dataclass(frozen=True)
class Chunk:
  """One chunk of a target array to write.

  Attributes:
    leaf: the target array.
    index: the chunk's index in the target's chunk grid.
    region: the part of the array it writes: the chunk's, or the whole array
      for a rule's transform (computed once, written whole).
    source: `(source leaf, chunk index)` of the chunk moved as bytes, or None
      when it is computed.
    cost: the bytes it holds while being written.
    order: sorts chunks that read the same source chunks next to each other.
  """

  leaf: Leaf
  index: tuple[int, ...]
  region: Region
  source: tuple[Leaf, tuple[int, ...]] | None
  cost: int
  order: tuple = ()


@dataclasses.dataclass(frozen=True)
class Layout:
  """The target arrays and the chunks to write."""

  arrays: dict[Leaf, StoredArray]
  chunks: list[Chunk]
  recipes: Mapping[Leaf, Recipe]


def _name(leaf: Leaf) -> str:
  return '.'.join(leaf)


def _moved(recipe: Recipe, source: SourceCheckpoint) -> StoredArray | None:
  """The chunk layout a target array keeps from the source when its chunks can
  move as bytes (its zarr metadata), or None when they must be computed."""
  if isinstance(recipe, Stored):
    array = source.arrays[recipe.leaf]
    return array if array.zarr is not None else None
  if not isinstance(recipe, Made) or recipe.transform is not None:
    return None
  if isinstance(recipe.op, relayout_ops.Keep) and len(recipe.inputs) == 1:
    return _moved(recipe.inputs[0], source)
  if isinstance(recipe.op, relayout_ops.Stack):
    layers = [_moved(r, source) for r in recipe.inputs]
    if None in layers or len({(a.shape, a.chunks, a.codec()) for a in layers}) != 1:
      return None
    first = layers[0]
    return dataclasses.replace(
        first, shape=(len(layers),) + first.shape, chunks=(1,) + first.chunks,
        zarr={**first.zarr, 'shape': [len(layers), *first.shape], 'chunks': [1, *first.chunks]},
    )
  if isinstance(recipe.op, relayout_ops.Slice) and len(recipe.inputs) == 1:
    stacked = _moved(recipe.inputs[0], source)
    if stacked is None or stacked.chunks[:1] != (1,):
      return None
    return dataclasses.replace(
        stacked, shape=stacked.shape[1:], chunks=stacked.chunks[1:],
        zarr={**stacked.zarr, 'shape': list(stacked.shape[1:]), 'chunks': list(stacked.chunks[1:])},
    )
  return None


def _source_chunk(recipe: Recipe, index: tuple[int, ...]) -> tuple[Leaf, tuple[int, ...]]:
  """The source chunk a moved target chunk is (see `_moved`: a chunk of one
  layer along a stacked axis, so chunk indices map as regions of one element)."""
  if isinstance(recipe, Stored):
    return recipe.leaf, index
  (k, region), = recipe.op.reads(tuple((i, i + 1) for i in index))
  return _source_chunk(recipe.inputs[k], tuple(a for a, _ in region))


def _inherited_chunks(recipe: Recipe, source: SourceCheckpoint) -> tuple[int, ...] | None:
  """The source's chunks as the target keeps them (a layer per chunk along a
  stacked axis), or None when the recipe computes new values."""
  if isinstance(recipe, Stored):
    return source.arrays[recipe.leaf].chunks
  if not isinstance(recipe, Made) or recipe.transform is not None:
    return None
  if isinstance(recipe.op, relayout_ops.Keep) and len(recipe.inputs) == 1:
    return _inherited_chunks(recipe.inputs[0], source)
  if isinstance(recipe.op, relayout_ops.Stack):
    inner = _inherited_chunks(recipe.inputs[0], source)
    return None if inner is None else (1,) + inner
  if isinstance(recipe.op, relayout_ops.Slice):
    inner = _inherited_chunks(recipe.inputs[0], source)
    return None if inner is None else inner[1:]
  return None


def _computed_chunks(recipe: Recipe, value: Any, source: SourceCheckpoint, budget: int) -> tuple[int, ...]:
  """Chunks for a computed array: the source's where it keeps them, else its
  shards (as Orbax chunks); at most an eighth of the budget each."""
  shape = tuple(recipe.shape)
  chunks = _inherited_chunks(recipe, source)
  if chunks is None:
    sharding = getattr(value, 'sharding', None)
    chunks = tuple(sharding.shard_shape(tuple(value.shape))) if sharding is not None else shape
    chunks = chunks + shape[len(chunks):]  # a key array's key-data axis
  chunks = tuple(max(1, min(c, n)) for c, n in zip(chunks, shape))
  limit = max(budget // 8, recipe.dtype.itemsize)
  if int(np.prod(chunks)) * recipe.dtype.itemsize > limit:
    chunks = tuple(compat.orbax_internals().subchunking.choose_chunk_shape(shape, chunks, recipe.dtype, limit))
  return chunks


def _read_bytes(recipe: Recipe, region: Region, source: SourceCheckpoint) -> int:
  """About how many bytes reading `region` of `recipe` decodes from the source."""
  if isinstance(recipe, Stored):
    array = source.arrays[recipe.leaf]
    touched = [(b - 1) // c - a // c + 1 if b > a else 0 for (a, b), c in zip(region, array.chunks)]
    return int(np.prod(touched or [1])) * int(np.prod(array.chunks or [1])) * array.dtype.itemsize
  if isinstance(recipe, Constant):
    return 0
  if recipe.transform is not None:
    return sum(_read_bytes(r, tuple((0, n) for n in r.shape), source) for r in recipe.inputs)
  return sum(_read_bytes(recipe.inputs[k], r, source) for k, r in recipe.op.reads(region))


def _first_source(recipe: Recipe, region: Region) -> tuple:
  """Where `region` starts in the first stored array it reads: chunks reading
  the same source chunk sort next to each other."""
  if isinstance(recipe, Stored):
    return (recipe.leaf, tuple(a for a, _ in region))
  if isinstance(recipe, Constant) or not recipe.inputs:
    return ()
  if recipe.transform is not None:
    return _first_source(recipe.inputs[0], tuple((0, n) for n in recipe.inputs[0].shape))
  reads = recipe.op.reads(region)
  return _first_source(recipe.inputs[reads[0][0]], reads[0][1]) if reads else ()


# A chunk written is held twice at its peak: as read or computed, and as handed
# to TensorStore, which copies it into the write it commits (ours goes once the
# checksum is taken: only one copy waits for the disk). The encoded bytes of a
# moved chunk are counted as its decoded size, which they can reach.
_HELD_COPIES = 2


def _nbytes(region: Region, dtype: np.dtype) -> int:
  return int(np.prod([b - a for a, b in region])) * dtype.itemsize


def plan_layout(
    recipes: Mapping[Leaf, Recipe], target: Any, source: SourceCheckpoint, budget: int
) -> Layout:
  """The target arrays (name, shape, chunks, codec) and every chunk to write."""
  values = {
      checkpoints.string_path(k): v for k, v in jax.tree_util.tree_flatten_with_path(target)[0]
  }
  arrays, chunks = {}, []
  for leaf, recipe in recipes.items():
    moved = _moved(recipe, source)
    if moved is not None and tuple(moved.shape) == tuple(recipe.shape):
      array = dataclasses.replace(moved, name=_name(leaf))
      for index in np.ndindex(*chunk_grid(array.shape, array.chunks)):
        region = chunk_region(array.shape, array.chunks, index)
        chunks.append(Chunk(
            leaf, index, region, _source_chunk(recipe, index),
            _HELD_COPIES * _nbytes(region, array.dtype), (leaf, index),
        ))
    else:
      shape = tuple(recipe.shape)
      grid_chunks = _computed_chunks(recipe, values[leaf], source, budget)
      array = StoredArray(
          _name(leaf), shape, recipe.dtype, grid_chunks,
          CheckpointWriter.zarr_metadata(shape, recipe.dtype, grid_chunks),
      )
      if isinstance(recipe, Made) and recipe.transform is not None:  # needs its inputs whole
        whole = tuple((0, n) for n in shape)
        cost = (_HELD_COPIES + 1) * array.nbytes  # its inputs, of about its size, besides
        chunks.append(Chunk(leaf, (), whole, None, cost, _first_source(recipe, whole) + (leaf,)))
      else:
        for index in np.ndindex(*chunk_grid(array.shape, array.chunks)):
          region = chunk_region(array.shape, array.chunks, index)
          cost = _HELD_COPIES * _nbytes(region, array.dtype) + _read_bytes(recipe, region, source)
          chunks.append(Chunk(leaf, index, region, None, cost, _first_source(recipe, region) + (leaf, index)))
    arrays[leaf] = array
  chunks.sort(key=lambda c: (c.source is None, repr(c.order)))
  return Layout(arrays, chunks, recipes)


async def _evaluate(recipe: Recipe, region: Region, source: SourceCheckpoint) -> np.ndarray:
  """`region` of what `recipe` makes, on the host."""
  if isinstance(recipe, Stored):
    return await source.read(recipe.leaf, region)
  if isinstance(recipe, Constant):
    return recipe.value[tuple(slice(a, b) for a, b in region)]
  if recipe.transform is not None:
    whole = await _transformed(recipe, source)
    return whole[tuple(slice(a, b) for a, b in region)]
  pieces = await asyncio.gather(*(_evaluate(recipe.inputs[k], r, source) for k, r in recipe.op.reads(region)))
  return recipe.op.assemble(pieces, region, recipe.dtype)


async def _transformed(recipe: Made, source: SourceCheckpoint) -> np.ndarray:
  """The whole of a recipe with a transform, computed as the in-memory
  conversion computes it (`converters.execution`), on the host's CPU device."""
  inputs = await asyncio.gather(*(
      _evaluate(r, tuple((0, n) for n in r.shape), source) for r in recipe.inputs
  ))
  values = recipe.op.values(inputs, recipe.transform.source_arrays, np)
  cpu = jax.devices('cpu')[0]
  with jax.default_device(cpu):
    result = np.asarray(jax.jit(recipe.transform)([jax.device_put(v, cpu) for v in values]))
  if result.shape != tuple(recipe.shape) or result.dtype != recipe.dtype:
    raise CheckpointError(
        f'a transform made {result.shape} {result.dtype}, the plan expected '
        f'{recipe.shape} {recipe.dtype}'
    )
  return result


def _crc_now(data) -> int:
  if isinstance(data, np.ndarray):
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
  return zlib.crc32(data)


async def _crc(data) -> int:
  """CRC-32 of encoded bytes, or of a decoded block's bytes; in a worker
  thread (zlib releases the GIL), so checksums and I/O overlap."""
  return await asyncio.to_thread(_crc_now, data)


async def _crcs(data: list) -> list[int]:
  """`_crc` of several blocks, in one worker thread."""
  return await asyncio.to_thread(lambda: [_crc_now(d) for d in data])


def _batches(chunks: list[Chunk], budget: int) -> list[tuple[Chunk, ...]]:
  """`chunks` in order, runs of moved chunks grouped into batches of up to a
  sixteenth of the budget (read, written and checked together: a TensorStore
  call awaited per chunk costs more than moving its bytes); a computed chunk
  alone."""
  limit = max(budget // 16, 1)
  out, batch, held = [], [], 0
  for chunk in chunks:
    if batch and (chunk.source is None or held + chunk.cost > limit):
      out.append(tuple(batch))
      batch, held = [], 0
    if chunk.source is None:
      out.append((chunk,))
    else:
      batch.append(chunk)
      held += chunk.cost
  if batch:
    out.append(tuple(batch))
  return out


def _batch_cost(batch: tuple[Chunk, ...]) -> int:
  return sum(c.cost for c in batch)


@contextlib.contextmanager
def _writing(writer: CheckpointWriter):
  try:
    yield
  except Exception as e:  # OSError for a full disk, among others
    raise CheckpointError(
        f'{writer.path}: writing the checkpoint failed: {checkpoints.reason(e)}; is the '
        'disk full or over a quota? Nothing was moved into place'
    ) from e


# Freed buffers stay in the C heap (the command's allocator never trims it,
# and chunks of mixed sizes fragment it): after every 1/8 of the budget freed,
# the free pages go back. Measured at 7.7 GiB, budget 1 GiB: peak 1160 -> 1030
# MiB above the interpreter, time unchanged (the disk is the bound).
_TRIM_EVERY = 8


async def _bounded(jobs: list, budget: int, run: Callable[[Any], Coroutine], cost: Callable[[Any], int]) -> list:
  """Runs `run(job)` for every job, in order, at most `budget` bytes of them at
  once (a larger one alone); every started job finishes before an error is
  raised, and none starts after one failed."""
  free = budget
  failed = False
  released = 0
  changed = asyncio.Condition()

  async def guarded(job, held: int):
    nonlocal free, failed, released
    try:
      return await run(job)
    except BaseException:
      failed = True
      raise
    finally:
      async with changed:
        free += held
        released += held
        changed.notify()

  tasks = []
  for job in jobs:
    held = min(cost(job), budget)  # a job over the budget waits for all of it
    async with changed:
      await changed.wait_for(lambda: failed or free >= held)
      if failed:
        break
      free -= held
    if released >= budget // _TRIM_EVERY:
      released = 0
      release_free_memory()
    tasks.append(asyncio.ensure_future(guarded(job, held)))
  await asyncio.gather(*tasks, return_exceptions=True)
  release_free_memory()
  for task in tasks:
    if task.exception() is not None:
      raise task.exception()
  return [task.result() for task in tasks]


def share(chunks: list[Chunk], process: int, processes: int) -> list[Chunk]:
  """The contiguous run of chunks one process writes, of about equal bytes."""
  if processes == 1:
    return chunks
  total = sum(c.cost for c in chunks) or 1
  out, seen = [], 0
  for chunk in chunks:
    if min(processes - 1, seen * processes // total) == process:
      out.append(chunk)
    seen += chunk.cost
  return out


def _read_error(info, e: BaseException) -> CheckpointError:
  if isinstance(e, CheckpointError):
    return e
  return CheckpointError(
      f'{info.path}: the checkpoint is corrupted or incomplete; reading its '
      f'arrays failed: {checkpoints.reason(e)}'
  )


def write(
    layout: Layout,
    source: SourceCheckpoint,
    writer: CheckpointWriter,
    chunks: list[Chunk],
    budget: int,
    create: bool,
) -> dict[tuple[Leaf, Region], int]:
  """Writes `chunks` (this process's share) of `layout`; `create` also writes
  every array's zarr metadata. Returns each chunk's CRC-32.

  Raises:
    CheckpointError: the source cannot be read (corrupted or incomplete), or
      the target cannot be written (a full disk).
  """

  async def computed(chunk: Chunk) -> list[int]:
    array = layout.arrays[chunk.leaf]
    try:
      data = await _evaluate(layout.recipes[chunk.leaf], chunk.region, source)
      data = np.asarray(data, dtype=array.dtype)
    except Exception as e:  # TensorStore raises several types for bad data
      raise _read_error(source.info, e) from e
    with _writing(writer):
      written = await writer.write(array, chunk.region, data)
    try:
      crc = await _crc(data)
    finally:
      del data  # TensorStore holds it until copied: then its own copy alone waits for the disk
      with _writing(writer):
        await written  # even after a failure: no write outlives its job
    return [crc]

  async def moved(batch: tuple[Chunk, ...]) -> list[int]:
    try:
      data = await source.read_chunks([c.source for c in batch])
    except Exception as e:  # TensorStore raises several types for bad data
      raise _read_error(source.info, e) from e
    with _writing(writer):
      written = writer.write_chunks([(layout.arrays[c.leaf], c.index, d) for c, d in zip(batch, data)])
    try:
      crcs = await _crcs(data)
    finally:
      del data  # TensorStore copied each chunk as its write started
      with _writing(writer):
        await written
    return crcs

  async def one(batch: tuple[Chunk, ...]) -> list[int]:
    return await (moved(batch) if batch[0].source is not None else computed(batch[0]))

  async def main():
    await writer.open()
    if create:
      await asyncio.gather(*(writer.create(a) for a in layout.arrays.values()))
    in_flight = budget - budget // CACHE_SHARE
    batches = _batches(chunks, in_flight)
    crcs = await _bounded(batches, in_flight, one, _batch_cost)
    await writer.close()
    return [crc for batch in crcs for crc in batch]

  crcs = run_coroutine(main())
  return {(c.leaf, c.region): crc for c, crc in zip(chunks, crcs)}


def verify(
    path: str,
    target: Any,
    chunks: list[Chunk],
    written: Mapping[tuple[Leaf, Region], int],
    budget: int,
) -> int:
  """Reads the written checkpoint at `path` back and checks it.

  Its Orbax tree metadata (`_METADATA`) must list the target's leaves, each
  array's zarr metadata their shapes and dtypes, and every chunk of `chunks`
  must read back with the checksum it was written with (moved chunks as
  bytes, computed ones decoded).

  Returns:
    The number of leaves checked.

  Raises:
    VerificationError: listing every leaf that is missing, extra, of another
      shape or dtype, unreadable or different.
  """
  wanted = checkpoints.leaves_of(target)
  _check_listed(path, wanted)
  # Each array's shape and dtype are read back from its zarr metadata (what
  # Orbax's restore reads), with its chunks.
  framework = 'linen' if any(leaf[0] == 'params' for leaf in wanted) else 'nnx'
  reader = SourceCheckpoint(checkpoints.CheckpointInfo(path, 'orbax', framework, wanted, target))
  try:
    outcomes = run_coroutine(_read_back(reader, chunks, written, budget))
  except CheckpointError as e:
    raise VerificationError(f'what was written cannot be read back: {e}') from e
  differing = sorted(
      '/'.join(leaf) for leaf, array in reader.arrays.items()
      if array.stored() != (tuple(wanted[leaf][0]), np.dtype(wanted[leaf][1]))
  )
  if differing:
    raise VerificationError(
        f'{path}: what was written does not hold the converted tree at '
        f'[{format_offenders(differing)}] (another shape or dtype); nothing was moved into place',
        differing,
    )
  unreadable = sorted({'/'.join(c.leaf) for c, o in zip(chunks, outcomes) if o is None})
  different = sorted({'/'.join(c.leaf) for c, o in zip(chunks, outcomes) if o is False})
  if unreadable:
    raise VerificationError(
        f'{path}: what was written cannot be read back at [{format_offenders(unreadable)}]; '
        'nothing was moved into place',
        unreadable,
    )
  if different:
    raise VerificationError(
        f'{path}: what was written differs from what was converted at '
        f'[{format_offenders(different)}]; the disk lost data, so nothing was moved into place',
        different,
    )
  return len(wanted)


def _check_listed(path: str, wanted: Mapping) -> None:
  """The written tree metadata (`_METADATA`) lists exactly the `wanted` leaves."""
  try:
    listed = listed_arrays(path)
  except Exception as e:  # a missing or unparsable _METADATA
    raise VerificationError(
        f'{path}: what was written cannot be read back: its Orbax tree metadata '
        f'(_METADATA) is unreadable: {checkpoints.reason(e)}; nothing was moved into place'
    ) from e
  missing = sorted(set(wanted) - set(listed))
  extra = sorted(set(listed) - set(wanted))
  if missing or extra:
    structure = ['/'.join(leaf) for leaf in missing + extra]
    raise VerificationError(
        f'{path}: what was written does not hold the converted tree at '
        f'[{format_offenders(structure)}]; nothing was moved into place',
        structure,
    )


async def _read_back(
    reader: SourceCheckpoint, chunks: list[Chunk], written: Mapping[tuple[Leaf, Region], int], budget: int
) -> list[bool | None]:
  """Per chunk: whether it reads back with its written checksum (None: unreadable)."""

  def same(batch: tuple[Chunk, ...], crcs: list[int]) -> list[bool]:
    return [crc == written[(c.leaf, c.region)] for c, crc in zip(batch, crcs)]

  async def computed(chunk: Chunk) -> list[bool | None]:
    try:
      data = np.asarray(await reader.read(chunk.leaf, chunk.region))
    except Exception:  # TensorStore raises several types for lost data
      return [None]
    return same((chunk,), [await _crc(data)])

  async def moved(batch: tuple[Chunk, ...]) -> list[bool | None]:
    try:
      data = await reader.read_chunks([(c.leaf, c.index) for c in batch])
    except Exception:  # TensorStore raises several types for lost data
      if len(batch) == 1:
        return [None]
      return [o for c in batch for o in await moved((c,))]  # which chunks were lost
    return same(batch, await _crcs(data))

  await reader.open()
  outcomes = await _bounded(
      _batches(chunks, budget), budget,
      lambda b: moved(b) if b[0].source is not None else computed(b[0]), _batch_cost,
  )
  return [o for batch in outcomes for o in batch]


def open_source(source: SourceCheckpoint) -> None:
  """Reads the source's array metadata (no array data)."""
  run_coroutine(source.open())


def _stored_leaf(recipe: Recipe) -> Leaf | None:
  """The one source array a recipe reads as it is (or casts), if any."""
  if isinstance(recipe, Stored):
    return recipe.leaf
  if (isinstance(recipe, Made) and isinstance(recipe.op, (relayout_ops.Keep, relayout_ops.Cast)) and len(recipe.inputs) == 1
      and recipe.transform is None):
    return _stored_leaf(recipe.inputs[0])
  return None


def extension_metadata(layout: Layout, source: SourceCheckpoint) -> dict[Leaf, dict | None]:
  """Orbax's extra metadata of each target array: a PRNG key array's
  implementation (kept from the source, or of a key the conversion made)."""
  kept = source.extension_metadata()
  out = {}
  for leaf, recipe in layout.recipes.items():
    if isinstance(recipe, Constant):
      out[leaf] = None if recipe.key_impl is None else {'random_key_impl': recipe.key_impl}
    else:
      stored = _stored_leaf(recipe)
      out[leaf] = kept.get(stored) if stored is not None else None
  return out


def step(layout: Layout, source: SourceCheckpoint) -> int:
  """The training step the target holds, read from the source."""
  for leaf in (('step',), ('optimizer', 'step', 'value')):
    if leaf in layout.recipes:
      stored = _stored_leaf(layout.recipes[leaf])
      if stored is not None:
        return int(np.asarray(run_coroutine(source.read(stored, ()))))
  raise CheckpointError('the converted training state has no step')
