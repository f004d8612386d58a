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
from converters.checkpoint.inspect import string_path
from converters.checkpoint.kit import correspondence_of_name
from converters.paths import PathMapping, format_path
from converters.presets import KIT_PATHS


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


def host_bits(x) -> np.ndarray:
  """`x` on the host as unsigned integers of its width: NaNs and -0.0 compare by their bits."""
  x = np.asarray(x)
  return (x.reshape(1) if x.ndim == 0 else x).view(f'u{x.dtype.itemsize}')


def bits_equal(xs: list[jax.Array], ys: list[jax.Array]) -> list[bool]:
  """Whether each `xs[i]` equals `ys[i]` bit for bit.

  Arrays with the same sharding are compared shard by shard, only the shards
  this process holds, with no compilation and no gathering; others on device.
  """
  if len(xs) != len(ys):
    raise ValueError(
        f'bits_equal: {len(xs)} arrays against {len(ys)}; compare the leaves of '
        'trees of one structure'
    )
  out = []
  for x, y in zip(xs, ys):
    if x.shape != y.shape or x.dtype != y.dtype:
      out.append(False)
    elif x.sharding == y.sharding:
      pairs = zip(
          sorted(x.addressable_shards, key=lambda s: s.device.id),
          sorted(y.addressable_shards, key=lambda s: s.device.id),
      )
      out.append(all(
          np.array_equal(host_bits(a.data), host_bits(b.data)) for a, b in pairs
      ))
    else:
      out.append(bool(_difference(x, y)[0]))
  return out


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
  """The NNX training-state path of a Linen `TrainState` leaf.

  Parameters map through `paths`, optimizer-state prefixes through the
  correspondence `converters.optimizer_state` converts with; a Linen leaf the
  NNX optimizer derives from its step is shown as `(optimizer/step)`.
  """
  keys = tuple(str(k) for k in linen_path)
  if keys == ('step',):
    return 'optimizer/step'
  if keys[-1:] == ('value',):
    keys = keys[:-1]  # the box's array; NNX paths name the Variable
  head, rest = keys[0], keys[1:]
  if head == 'params':
    found = paths.match_all('linen', rest)
    if len(found) != 1:
      return '?'
    return format_path(('model',) + found[0].rule.path('nnx', found[0].layout, found[0].index))
  corr = correspondence_of_name(optimizer)
  typed = tuple(int(k) if k.isdigit() else k for k in rest)  # optax sequence indices
  if typed in corr.derived_from_step:
    return '(optimizer/step)'
  prefix, param = typed, ()
  for start in range(len(rest)):
    found = paths.match_all('linen', rest[start:])
    if len(found) == 1:
      prefix = typed[:start]
      param = found[0].rule.path('nnx', found[0].layout, found[0].index)
      break
  nnx_prefix = corr.nnx_prefix(prefix)
  return '?' if nnx_prefix is None else format_path(('optimizer',) + nnx_prefix + param)


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


def as_json(rows: list[LeafComparison]) -> list[dict[str, Any]]:
  return [
      dataclasses.asdict(r) | {
          'shape': list(r.shape),
          'max_abs_diff': None if np.isnan(r.max_abs_diff) else r.max_abs_diff,
      }
      for r in rows
  ]


def compare_checkpoints(
    a: str, b: str, *, mesh_shape=(2, 4), annotation='device', rules=None,
    layer_partition=None, allow_unfinished: bool = False,
) -> tuple[list[LeafComparison], tuple[str, str], dict]:
  """Rows comparing the training states of two checkpoints, in A's layout.

  `allow_unfinished` reads Orbax saves that never finished (see
  `checkpoints.inspect`).

  Raises:
    CheckpointError: a checkpoint cannot be read.
    VerificationError: A and B hold different models or optimizers.
  """
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint import training_states
  from kit_mlp.description import GUIDE_RULES
  from converters.errors import VerificationError

  infos = checkpoints.inspect(a, allow_unfinished), checkpoints.inspect(b, allow_unfinished)
  model = lambda i: (i.num_layers, i.depth, i.dtype, i.optimizer)
  if model(infos[0]) != model(infos[1]):
    raise VerificationError(
        'A and B hold different models: (layers, depth, dtype, optimizer) '
        f'{model(infos[0])} != {model(infos[1])}'
    )
  optimizer = infos[0].optimizer
  checkpoints.check_layer_partition(layer_partition, [i.layout for i in infos])
  descs = [
      checkpoints.description(i, mesh_shape, annotation, rules or GUIDE_RULES, layer_partition)
      for i in infos
  ]
  mesh = descs[0].make_mesh()
  trainers = []
  for info, desc in zip(infos, descs):
    trainer = checkpoints.trainer_for(info.framework, desc, mesh, optimizer)
    checkpoints.check_structure(info, checkpoints.expected_leaves(info.framework, trainer))
    trainers.append(trainer)
  # Both sides as Linen TrainStates in A's layout.
  linen = trainers[0] if infos[0].framework == 'linen' else checkpoints.trainer_for(
      'linen', descs[0], mesh, optimizer
  )
  middle = checkpoints.trainer_for('nnx', descs[0], mesh, optimizer)
  states = []
  with jax.set_mesh(mesh):
    for info, trainer in zip(infos, trainers):
      state = checkpoints.restore(info, trainer)
      if info.framework != 'linen' or info.layout != infos[0].layout:
        state = training_states.convert(state, info.framework, trainer, 'linen', linen, middle)
      states.append(state)
    rows = compare_linen_states(*states, optimizer)
  names = {'linen': 'Linen', 'nnx': 'NNX'}
  if infos[0].framework != infos[1].framework:
    labels = tuple(names[i.framework] for i in infos)
  else:
    labels = ('A', 'B')
  return rows, labels, {'a': infos[0].summary(), 'b': infos[1].summary()}
