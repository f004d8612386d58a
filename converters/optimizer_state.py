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

import numpy as np
from flax import nnx
from flax.training.train_state import TrainState

from converters import metadata as md
from converters.conversion import Conversion
from converters.errors import OptimizerStateError, format_offenders
from converters.linen_trees import read_collection
from converters.nnx_trees import read_state
from converters.paths import format_path


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


def linen_opt_to_nnx(state: TrainState, param_flat, optimizer, conversion: Conversion):
  """`{nnx path: (value, annotation or None)}` of the optimizer part.

  Moment trees are added to `conversion` (their values are built by its
  `run`); scalars (step, counts) have no annotation.
  """
  corr = correspondence_of(optimizer)
  opt_flat = read_collection(state.opt_state, 'opt_state')

  def derived_from_step(path: tuple, value) -> bool:
    """Whether the scalar at `path` is one the optimizer keeps only as its step."""
    if path not in corr.derived_from_step:
      return False
    if not np.array_equal(np.asarray(value), np.asarray(state.step)):
      raise OptimizerStateError(
          f'opt_state/{format_path(path)}={np.asarray(value)} differs from '
          f'step={np.asarray(state.step)}; {corr.name} keeps only the step, '
          'so this state cannot be converted without loss',
          [format_path(path)],
      )
    return True

  moved, unknown = _moved(
      opt_flat, param_flat, corr.nnx_prefix, conversion, sides=('linen', 'nnx'),
      skip=derived_from_step,
  )
  if unknown:
    raise OptimizerStateError(
        f'opt_state leaves with no counterpart in {corr.name}: '
        f'{format_offenders(unknown)}; the Linen optimizer and the NNX '
        'optimizer must use the same optax transform',
        unknown,
    )
  return {('optimizer', 'step'): (state.step, None)} | {
      ('optimizer',) + p: leaf for p, leaf in moved.items()
  }


def nnx_opt_to_linen(optimizer, param_flat, conversion: Conversion):
  """`({optax path: (value, annotation or None)}, step)` of an NNX optimizer.

  Moment trees are added to `conversion`, as `linen_opt_to_nnx` does; the
  caller fills the target's optax state with them (`converters.filling`).
  """
  corr = correspondence_of(optimizer)
  opt_flat = read_state(nnx.state(optimizer), 'optimizer', conversion.options.resolution_rules)
  step = opt_flat.pop(('step',))[0]
  moved, unknown = _moved(opt_flat, param_flat, corr.linen_prefix, conversion, sides=('nnx', 'linen'))
  if unknown:
    raise OptimizerStateError(
        f'optimizer leaves with no counterpart in an optax state: '
        f'{format_offenders(unknown)}',
        unknown,
    )
  return moved | {path: (step, None) for path in corr.derived_from_step}, step


def _moved(opt_flat, param_flat, prefix_of, conversion: Conversion, *, sides, skip=None):
  """`({other side's path: (value, annotation or None)}, unknown prefixes)`.

  Each moment tree is converted as its parameters are (added to
  `conversion`); each scalar is moved as it is; both under the prefix that
  `prefix_of` gives (None: no counterpart). A scalar for which
  `skip(path, value)` is true is left out (`skip` may refuse it).
  """
  groups, scalars = _group_by_param(opt_flat, set(param_flat))
  moved: dict[tuple, tuple[Any, md.Annotation | None]] = {}
  unknown = []
  for prefix, flat in groups.items():
    if (new := prefix_of(prefix)) is None:
      unknown.append(format_path(prefix))
      continue
    for p, leaf in conversion.add(flat, *sides).items():
      moved[new + p] = leaf
  for path, value in scalars.items():
    if skip is not None and skip(path, value):
      continue
    if (new := prefix_of(path)) is None:
      unknown.append(format_path(path))
      continue
    moved[new] = (value, None)
  return moved, unknown
