"""Carrying out a checked plan: the target arrays, built on device.

Leaves whose layout does not change are the input arrays themselves: no data
is copied. Stacks, slices and value transforms run on device in one
`jax.jit` whose `out_shardings` come from the target annotations, so they
never pass through the host and work on arrays that are not fully
addressable; or, donating the sources, one jit per group of layers, each
group's sources deleted as soon as its results exist (a buffer another input
leaf shares is never deleted). Abstract sources give abstract targets that
record how they were made (`converters.provenance`).
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from converters import provenance
from converters.allocator import release_free_memory
from converters.errors import ShapeError
from converters.paths import format_path
from converters.planning import Flat, Target


def buffer_keys(value) -> frozenset:
  """What identifies the device buffers of an array: (device, address) of each shard."""
  if not isinstance(value, jax.Array) or value.is_deleted():
    return frozenset()
  try:
    return frozenset(
        (shard.device.id, shard.data.unsafe_buffer_pointer()) for shard in value.addressable_shards
    )
  except Exception:  # a backend without raw pointers: the array itself stands for them
    return frozenset({('array', id(value))})


def shared_buffers(values: Iterable[Any]) -> frozenset:
  """The buffers that more than one of `values` holds (tied weights, an array
  passed twice, a scalar passed through): never to be deleted."""
  uses = Counter()
  for value in values:
    uses.update(buffer_keys(value))
  return frozenset(key for key, n in uses.items() if n > 1)


def _relayout(recipe, *arrays):
  results = []
  for op, inputs, transform in recipe:
    parts = 1 if transform is None else transform.source_arrays
    values = op.values([arrays[i] for i in inputs], parts, jnp)
    results.append(values[0] if transform is None else transform(values))
  return results


@functools.lru_cache(maxsize=64)
def _compiled_relayout(recipe: tuple, out_shardings: tuple):
  """One jitted relayout per recipe and target shardings, reused across calls."""
  return jax.jit(
      functools.partial(_relayout, recipe), out_shardings=list(out_shardings)
  )


def _groups(moved: list[tuple], targets: Mapping[tuple, Target]) -> list[list[tuple]]:
  """`moved` split so no two groups read the same source: a stack with its
  layers, or every slice of one stacked array."""
  groups: dict[tuple, list[tuple]] = defaultdict(list)
  for p in moved:
    groups[targets[p].sources].append(p)
  return list(groups.values())


def _run(
    paths: list[tuple],
    targets: Mapping[tuple, Target],
    flat: Flat,
    shardings: Mapping[tuple, NamedSharding | None],
) -> list[Any]:
  sources = sorted({s for p in paths for s in targets[p].sources}, key=format_path)
  position = {s: i for i, s in enumerate(sources)}
  recipe = tuple(
      (targets[p].op, tuple(position[s] for s in targets[p].sources), targets[p].transform)
      for p in paths
  )
  relayout = _compiled_relayout(recipe, tuple(shardings[p] for p in paths))
  return relayout(*[flat[s][0] for s in sources])


def execute(
    targets: Mapping[tuple, Target],
    flat: Flat,
    shardings: Mapping[tuple, NamedSharding | None],
    *,
    donate: bool = False,
    shared: frozenset = frozenset(),
) -> dict[tuple, Any]:
  """The target arrays: inputs themselves where kept, one jit for the rest.

  With `donate`, the relayout runs one group of layers at a time and deletes
  each group's source arrays once its results exist, so it holds one group
  twice instead of every moved array. A source whose buffers are in `shared`
  (used by another input leaf), or are also a kept output, is never deleted.
  Call `converters.checks.check_executable` first (`Conversion.add` does).
  """
  out: dict[tuple, Any] = {}
  moved = []
  for path, t in targets.items():
    if t.kept:
      out[path] = flat[t.sources[0]][0]
    elif isinstance(flat[t.sources[0]][0], jax.ShapeDtypeStruct):
      out[path] = provenance.record(
          jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=shardings[path]),
          provenance.Derivation(t.op, tuple(flat[s][0] for s in t.sources), t.transform),
      )
    else:
      moved.append(path)
  if not moved:
    return out
  kept = set(shared)
  for value in out.values():
    kept |= buffer_keys(value)
  if donate:
    batches = _groups(moved, targets)
  else:  # arrays on a mesh, and arrays outside any mesh (by device), compile apart
    by_place: dict[Any, list[tuple]] = defaultdict(list)
    for p in moved:
      value = flat[targets[p].sources[0]][0]
      device = next(iter(value.devices())) if isinstance(value, jax.Array) else None
      by_place['mesh' if shardings[p] is not None else device].append(p)
    batches = list(by_place.values())
  for group in batches:
    results = _run(group, targets, flat, shardings)
    if donate:  # one group at a time: the next starts once these sources are freed
      jax.block_until_ready(results)
    for path, result in zip(group, results):
      if result.shape != targets[path].shape:  # a broken plan, not bad input
        raise ShapeError(f'{format_path(path)}: relayout gave {result.shape}')
      out[path] = result
    if donate:
      for source in {s for p in group for s in targets[p].sources}:
        value = flat[source][0]
        buffers = buffer_keys(value)
        if buffers and not buffers & kept:
          value.delete()
      # Layer-sized buffers are kept by the C allocator, not reused for the
      # larger stacks: give them back before the next group.
      release_free_memory()
  return out

