"""Optimizer state: a `TrainState`'s optax state <-> an NNX optimizer's state.

Leaves map one to one. An optax state corresponds to `nnx.Optimizer.opt_state`
under the same keys (`0/mu/...`), each moment tree converted exactly like the
parameters (paths, layout, annotations). Other NNX optimizers (hand-written
ones) say how their state corresponds to an optax chain by registering an
`OptimizerCorrespondence` for their type, e.g. an SGD whose `momentum` is the
trace of `optax.chain(optax.ema(decay, debias=False), optax.scale(-lr))`:

    register_optimizer(MySGD, OptimizerCorrespondence(
        'MySGD', to_nnx={(0, 'ema'): ('momentum',)}, derived_from_step=((0, 'count'),)))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.training.train_state import TrainState

from converters import metadata as md
from converters.errors import LeafErrors, OptimizerStateError, format_offenders
from converters.paths import format_path
from converters.tree_io import (
    Batch,
    check_against_template,
    in_target_form,
    check_keys,
    keys_of,
    read_linen_tree,
    read_nnx_state,
    scalar_like,
)


def _split_param_suffix(path: tuple, param_paths: set[tuple]) -> tuple[tuple, tuple | None]:
  for i in range(len(path)):
    if path[i:] in param_paths:
      return path[:i], path[i:]
  return path, None


def _group_by_param(flat, param_paths) -> tuple[dict[tuple, dict], dict[tuple, Any]]:
  """Moment trees by their optimizer-state prefix, and the other (scalar) leaves."""
  groups: dict[tuple, dict] = {}
  scalars: dict[tuple, Any] = {}
  for path, (value, annotation, *_) in flat.items():
    prefix, param = _split_param_suffix(path, param_paths)
    if param is None:
      scalars[path] = value
    else:
      groups.setdefault(prefix, {})[param] = (value, annotation)
  return groups, scalars


@dataclasses.dataclass(frozen=True)
class OptimizerCorrespondence:
  """How an NNX optimizer's state corresponds to an optax state.

  Attributes:
    name: how errors name the optimizer.
    to_nnx: optax-state prefix -> NNX optimizer-state prefix, for every subtree
      the NNX optimizer keeps (e.g. `{(0, 'ema'): ('momentum',)}`: the first
      transform's `ema` trace is the optimizer's `momentum`). `None`: the
      optimizer keeps the optax state itself under `opt_state`, as
      `nnx.Optimizer` does.
    derived_from_step: optax leaves the NNX optimizer does not keep because
      they always equal its step (e.g. an `ema`'s `count`); converting a state
      where one differs from the step is refused.
  """

  name: str
  to_nnx: Mapping[tuple, tuple] | None = None
  derived_from_step: tuple[tuple, ...] = ()

  def nnx_prefix(self, linen_prefix: tuple) -> tuple | None:
    if self.to_nnx is None:
      return ('opt_state',) + linen_prefix
    return self.to_nnx.get(linen_prefix)

  def linen_prefix(self, nnx_prefix: tuple) -> tuple | None:
    if self.to_nnx is None:
      return nnx_prefix[1:] if nnx_prefix[:1] == ('opt_state',) else None
    return {v: k for k, v in self.to_nnx.items()}.get(nnx_prefix)


#: `nnx.Optimizer(model, tx, wrt=nnx.Param)`: the optax state under `opt_state`.
NNX_OPTIMIZER = OptimizerCorrespondence('nnx.Optimizer')

_REGISTRY: dict[type, OptimizerCorrespondence] = {nnx.Optimizer: NNX_OPTIMIZER}


def register_optimizer(optimizer_type: type, correspondence: OptimizerCorrespondence) -> None:
  """Says how the state of `optimizer_type` (and its subclasses) corresponds to optax.

  Registering a type again replaces its correspondence.
  """
  if not isinstance(optimizer_type, type):
    raise TypeError(f'register_optimizer: {optimizer_type!r} is not a class')
  if not isinstance(correspondence, OptimizerCorrespondence):
    raise TypeError(
        f'register_optimizer: {correspondence!r} is not an OptimizerCorrespondence'
    )
  _REGISTRY[optimizer_type] = correspondence


def correspondence_of(optimizer) -> OptimizerCorrespondence:
  """The registered correspondence of `optimizer`'s type (the nearest base class's)."""
  for cls in type(optimizer).__mro__:
    if cls in _REGISTRY:
      return _REGISTRY[cls]
  known = ', '.join(sorted(f'{t.__module__}.{t.__qualname__}' for t in _REGISTRY))
  raise OptimizerStateError(
      f'optimizer of type {type(optimizer).__name__} has a state structure the '
      f'converters do not know (registered: {known}); use '
      'nnx.Optimizer(model, tx, wrt=nnx.Param), or say how its state corresponds '
      'to optax with converters.register_optimizer(type, OptimizerCorrespondence(...))'
  )


def linen_opt_to_nnx(state: TrainState, param_flat, optimizer, batch: Batch):
  """`{nnx path: (value, annotation or None)}` of the optimizer part.

  Moment trees are planned in `batch` (their values are built by its `run`);
  scalars (step, counts) have no annotation.
  """
  corr = correspondence_of(optimizer)
  param_paths = set(param_flat)
  opt_flat = read_linen_tree(state.opt_state, 'opt_state')
  groups, scalars = _group_by_param(opt_flat, param_paths)
  out = {('optimizer', 'step'): (state.step, None)}
  unknown = []
  for prefix, flat in groups.items():
    nnx_prefix = corr.nnx_prefix(prefix)
    if nnx_prefix is None:
      unknown.append(format_path(prefix))
      continue
    for p, va in batch.plan(flat, 'linen', 'nnx').items():
      out[('optimizer',) + nnx_prefix + p] = va
  for path, value in scalars.items():
    if path in corr.derived_from_step:
      if np.asarray(value) != np.asarray(state.step):
        raise OptimizerStateError(
            f'opt_state/{format_path(path)}={np.asarray(value)} differs from '
            f'step={np.asarray(state.step)}; {corr.name} keeps only the step, '
            'so this state cannot be converted without loss',
            [format_path(path)],
        )
      continue
    nnx_prefix = corr.nnx_prefix(path)
    if nnx_prefix is None:
      unknown.append(format_path(path))
      continue
    out[('optimizer',) + nnx_prefix] = (value, None)
  if unknown:
    raise OptimizerStateError(
        f'opt_state leaves with no counterpart in {corr.name}: '
        f'{format_offenders(unknown)}; the Linen optimizer and the NNX '
        'optimizer must use the same optax transform',
        unknown,
    )
  return out


def nnx_opt_to_linen(optimizer, param_flat, target: TrainState, batch: Batch, mesh_hint):
  """`(step, opt_state)` of a Linen `target` filled from an NNX optimizer.

  Plans the moment trees in `batch`, checks everything against `target`,
  then runs the batch (parameters included) and builds the state.
  """
  corr = correspondence_of(optimizer)
  opt_flat = read_nnx_state(nnx.state(optimizer), 'optimizer', batch.options.resolution_rules)
  step = opt_flat.pop(('step',))[0]
  groups, scalars = _group_by_param(opt_flat, set(param_flat))
  produced: dict[tuple, tuple[Any, md.Annotation | None]] = {}
  unknown = []
  for prefix, flat in groups.items():
    linen_prefix = corr.linen_prefix(prefix)
    if linen_prefix is None:
      unknown.append(format_path(prefix))
      continue
    for p, va in batch.plan(flat, 'nnx', 'linen').items():
      produced[linen_prefix + p] = va
  for path, value in scalars.items():
    linen_prefix = corr.linen_prefix(path)
    if linen_prefix is None:
      unknown.append(format_path(path))
      continue
    produced[linen_prefix] = (value, None)
  for path in corr.derived_from_step:
    produced[path] = (step, None)
  if unknown:
    raise OptimizerStateError(
        f'optimizer leaves with no counterpart in an optax state: '
        f'{format_offenders(unknown)}',
        unknown,
    )
  t_leaves, treedef = jax.tree_util.tree_flatten_with_path(target.opt_state, is_leaf=md.is_linen_box)
  t_paths = [keys_of(k) for k, _ in t_leaves]
  check_keys('nnx -> linen opt_state', t_paths, produced)
  if len(set(t_paths)) != len(t_paths):
    raise OptimizerStateError('target.opt_state: two leaves share one path; pass a real optax state')
  scalars = {}
  errors = LeafErrors()
  for path, (_, t_leaf) in zip(t_paths, t_leaves):
    t_value, t_annotation = md.read_linen(t_leaf, 'target.opt_state/' + format_path(path))
    value, annotation = produced[path]
    where = 'opt_state/' + format_path(path)
    with errors.leaf():
      if annotation is None:
        scalars[path] = scalar_like(value, t_value.dtype, mesh_hint, where)
      else:
        check_against_template(
            where, value, annotation, t_value, t_annotation, batch.options.resolution_rules
        )
        produced[path] = (
            value, md.with_default_rules(in_target_form(annotation, t_annotation), batch.options.rules)
        )
  errors.raise_any()
  step_dtype = getattr(target.step, 'dtype', np.dtype('int32'))
  step = scalar_like(step, step_dtype, mesh_hint, 'step')
  batch.protect([step, *scalars.values()])
  batch.run()
  leaves = [
      scalars[path] if path in scalars else md.write_linen(batch.value(produced[path][0]), produced[path][1])
      for path in t_paths
  ]
  return step, jax.tree.unflatten(treedef, leaves)
