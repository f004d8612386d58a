"""Leaf-by-leaf comparison of two training states, Linen and NNX paths side by side.

`compare_states` puts two training states in one form (each is converted to
a Linen `TrainState` in the first one's layout; a same-layout conversion copies
nothing) and compares every leaf on device: shape, dtype, the PartitionSpec of
the actual sharding, bit equality and the largest absolute difference. Each
row names the leaf on both sides, so `linen-nnx compare` can print the table
users read and CI checks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.training.train_state import TrainState

from converters import metadata as md
from converters.checkpoints import string_path
from converters.paths import KIT_PATHS, PathMapping, format_path
from converters.report import format_table


@dataclasses.dataclass(frozen=True)
class LeafComparison:
  """One row of a comparison."""

  linen_path: str
  nnx_path: str
  shape: tuple[int, ...]
  dtype: str
  spec_a: str
  spec_b: str
  max_abs_diff: float
  identical: bool


def _bits(x: jax.Array) -> jax.Array:
  """Integer view of `x`, so NaNs and signed zeros compare by their bits."""
  if jnp.issubdtype(x.dtype, jnp.floating):
    width = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, width)
  return x


@jax.jit
def _difference(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  equal = jnp.all(_bits(a) == _bits(b))
  diff = jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))
  return equal, jnp.max(diff, initial=0.0)


def leaf_difference(a: jax.Array, b: jax.Array) -> tuple[bool, float]:
  """`(bit-identical, max |a - b|)`, computed on device."""
  if a.shape != b.shape or a.dtype != b.dtype:
    return False, float('nan')
  equal, diff = _difference(a, b)
  return bool(equal), float(diff)


def _spec(value) -> str:
  sharding = getattr(value, 'sharding', None)
  spec = getattr(sharding, 'spec', None)
  return str(tuple(spec)) if spec is not None else '-'


def nnx_path_of(linen_path: tuple, optimizer: str, paths: PathMapping = KIT_PATHS) -> str:
  """The NNX training-state path of a Linen `TrainState` leaf (see `optimizer_state`)."""
  keys = tuple(str(k) for k in linen_path)
  if keys == ('step',):
    return 'optimizer/step'
  if keys[-1:] == ('value',):
    keys = keys[:-1]  # the box's array; NNX paths name the Variable
  head, rest = keys[0], keys[1:]
  for start in range(len(rest)):
    param = rest[start:]
    found = paths.match_all('linen', param)
    if len(found) == 1:
      match = found[0]
      nnx_param = match.rule.path('nnx', match.layout, match.index)
      prefix = rest[:start]
      break
  else:
    if head == 'opt_state' and optimizer == 'fsdp_sgd' and rest == ('0', 'count'):
      return '(optimizer/step)'  # the NNX SGD keeps the step only
    return ('optimizer/opt_state/' + '/'.join(rest)) if head == 'opt_state' else '?'
  if head == 'params':
    return format_path(('model',) + nnx_param)
  if optimizer == 'fsdp_sgd':
    return format_path(('optimizer', 'momentum') + nnx_param)
  return format_path(('optimizer', 'opt_state') + prefix + nnx_param)


def compare_linen_states(
    a: TrainState, b: TrainState, optimizer: str, paths: PathMapping = KIT_PATHS
) -> list[LeafComparison]:
  """Rows comparing two Linen `TrainState`s of the same structure."""
  flat_b = {
      string_path(k): v
      for k, v in jax.tree_util.tree_flatten_with_path(b, is_leaf=md.is_linen_box)[0]
  }
  rows = []
  for keypath, leaf_a in jax.tree_util.tree_flatten_with_path(a, is_leaf=md.is_linen_box)[0]:
    path = string_path(keypath)
    leaf_b = flat_b[path]
    where = '/'.join(path)
    value_a, value_b = md.read_linen(leaf_a, where)[0], md.read_linen(leaf_b, where)[0]
    same, diff = leaf_difference(value_a, value_b)
    spec_a, spec_b = _spec(value_a), _spec(value_b)
    rows.append(
        LeafComparison(
            linen_path='/'.join(path),
            nnx_path=nnx_path_of(path, optimizer, paths),
            shape=tuple(value_a.shape),
            dtype=str(value_a.dtype),
            spec_a=spec_a,
            spec_b=spec_b,
            max_abs_diff=diff,
            identical=same and spec_a == spec_b,
        )
    )
  return rows


def table(rows: list[LeafComparison], labels: tuple[str, str] = ('Linen', 'NNX')) -> str:
  header = [
      'Linen path', 'NNX path', 'shape', 'dtype', f'{labels[0]} spec',
      f'{labels[1]} spec', 'max |diff|', 'same',
  ]
  body = [
      [
          r.linen_path, r.nnx_path, str(r.shape), r.dtype, r.spec_a, r.spec_b,
          f'{r.max_abs_diff:.3g}', 'yes' if r.identical else 'NO',
      ]
      for r in rows
  ]
  return format_table(header, body)


def as_json(rows: list[LeafComparison]) -> list[dict[str, Any]]:
  return [
      dataclasses.asdict(r) | {
          'shape': list(r.shape),
          'max_abs_diff': None if np.isnan(r.max_abs_diff) else r.max_abs_diff,
      }
      for r in rows
  ]
