"""Copying a Linen model's variables into its NNX port by a `model_zoo.paths` table.

Plain dict and `nnx.state`/`nnx.update` manipulation, independent of the
kit's `converters`, so that the zoo's tables and models are checked on their own.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.traverse_util import flatten_dict

from model_zoo.paths import FusedRow, Row

#: The NNX Variable type of each Linen collection.
VARIABLE_TYPES = {'params': nnx.Param, 'batch_stats': nnx.BatchStat, 'cache': nnx.Cache}


class Reshaped(str):
  """A Linen path whose array the NNX Variable holds reshaped (a row with a `pattern`)."""


def expand(rows: tuple[Row | FusedRow, ...], count: int, stacked: bool = False) -> list[tuple]:
  """`(linen, nnx)` path pairs of a table's rows for `count` repeated layers
  (a fused row's `linen` is the tuple of its parts' paths)."""
  pairs = []
  for row in rows:
    if '{i}' not in row.nnx:
      row_pairs = [(row.linen, row.nnx)]
    elif stacked:
      assert row.linen_stacked is not None and row.nnx_stacked is not None, row
      row_pairs = [(row.linen_stacked, row.nnx_stacked)]
    elif isinstance(row, FusedRow):
      row_pairs = [(tuple(p.format(i=i) for p in row.linen), row.nnx.format(i=i)) for i in range(count)]
    else:
      row_pairs = [(row.linen.format(i=i), row.nnx.format(i=i)) for i in range(count)]
    if isinstance(row, Row) and row.pattern is not None:
      row_pairs = [(Reshaped(linen), nnx) for linen, nnx in row_pairs]
    pairs.extend(row_pairs)
  return pairs


def linen_flat(variables, collection: str) -> dict[str, jax.Array]:
  """'/'-joined path below `collection` -> unboxed array."""
  return flatten_dict(nn.meta.unbox(dict(variables[collection])), sep='/')


def nnx_flat(model: nnx.Module, variable_type=nnx.Variable) -> dict[str, nnx.Variable]:
  """'/'-joined attribute path -> Variable of `variable_type` in `model`."""
  state = nnx.state(model, variable_type)
  return {'/'.join(map(str, path)): var for path, var in nnx.to_flat_state(state)}


def paired_paths(variables, model, table, count, stacked=False):
  """`{collection: [(linen_path, nnx_path)]}` for the variables that exist in both models.

  Fails if a path exists on one side only, or if a Linen variable or an NNX
  Variable of a mapped type is named by no row.
  """
  result = {}
  for collection, variable_type in VARIABLE_TYPES.items():
    linen = linen_flat(variables, collection) if collection in variables else {}
    ported = nnx_flat(model, variable_type)
    pairs = []
    for linen_path, nnx_path in expand(table.get(collection, ()), count, stacked):
      parts = linen_path if isinstance(linen_path, tuple) else (linen_path,)
      in_linen, in_nnx = all(p in linen for p in parts), nnx_path in ported
      assert in_linen == in_nnx, (
          f'{collection}: {linen_path!r} in Linen: {in_linen}, {nnx_path!r} in NNX: {in_nnx}'
      )
      if in_linen:
        pairs.append((linen_path, nnx_path))
    named = [p for linen_path, _ in pairs for p in _parts(linen_path)]
    assert sorted(named) == sorted(linen), (
        f'{collection}: Linen paths without a row: {sorted(set(linen) - set(named))}'
    )
    assert sorted(p for _, p in pairs) == sorted(ported), (
        f'{collection}: NNX paths without a row: {sorted(set(ported) - {p for _, p in pairs})}'
    )
    if pairs:
      result[collection] = pairs
  return result


def _parts(linen_path) -> tuple[str, ...]:
  return linen_path if isinstance(linen_path, tuple) else (linen_path,)


def _linen_value(linen: dict, linen_path, shape: tuple[int, ...]):
  """The Linen array of a path reshaped to `shape` (the NNX array's), or a
  fused row's parts, each reshaped to its leading axes, side by side on the last."""
  if isinstance(linen_path, tuple):
    parts = [np.asarray(linen[p]).reshape(shape[:-1] + (-1,)) for p in linen_path]
    return np.concatenate(parts, axis=-1)
  value = linen[linen_path]
  return np.asarray(value).reshape(shape) if isinstance(linen_path, Reshaped) else value


def copy_linen_to_nnx(variables, model: nnx.Module, table, count: int, stacked: bool = False) -> int:
  """Sets every mapped Variable of `model` to the Linen value its row names; returns how many.

  The values keep the shardings the NNX Variables had.
  """
  pairs = paired_paths(variables, model, table, count, stacked)
  state = nnx.state(model, tuple(VARIABLE_TYPES[c] for c in pairs))
  ported = {'/'.join(map(str, path)): var for path, var in nnx.to_flat_state(state)}
  copied = 0
  for collection, collection_pairs in pairs.items():
    linen = linen_flat(variables, collection)
    for linen_path, nnx_path in collection_pairs:
      var = ported[nnx_path]
      value = _linen_value(linen, linen_path, var.shape)
      old = var[...]
      assert value.shape == old.shape and value.dtype == old.dtype, (
          f'{linen_path} {value.shape} {value.dtype} <-> {nnx_path} {old.shape} {old.dtype}'
      )
      # Keep the sharding the port gave its Variable: a replicated copy of a
      # parameter Linen's rules shard would compile to another program.
      var.set_value(jax.device_put(value, old.sharding))
      copied += 1
  nnx.update(model, state)
  return copied


def assert_same_values(variables, model, table, count, stacked=False, *, exact=True, **tolerance):
  """Every paired Linen variable equals its NNX Variable (bit for bit unless `exact=False`)."""
  pairs = paired_paths(variables, model, table, count, stacked)
  for collection, collection_pairs in pairs.items():
    linen = linen_flat(variables, collection)
    ported = nnx_flat(model, VARIABLE_TYPES[collection])
    for linen_path, nnx_path in collection_pairs:
      actual = np.asarray(ported[nnx_path][...])
      expected = np.asarray(_linen_value(linen, linen_path, actual.shape))
      if exact:
        np.testing.assert_array_equal(actual, expected, err_msg=f'{linen_path} <-> {nnx_path}')
      else:
        np.testing.assert_allclose(actual, expected, err_msg=f'{linen_path} <-> {nnx_path}', **tolerance)
