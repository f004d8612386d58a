"""The kit's own MLP as a model pair of the checkpoint tool, and its optimizers.

A checkpoint of the kit's `linen_impl` / `nnx_impl` MLP describes its model
itself: `describe` reads the layout, layer count, width, dtype and optimizer
from its leaves (`DotReluDot_<i>` layers, `ScanDotReluDot_0` stacked), and
`KitModels` builds both sides from that description, the way `UserModels`
builds them from a user's factories: both are `ModelPair`s, which is all the
checkpoint tool knows of either. `models_for` makes the one the command
line's options describe: `KitModels` when no model is given, so the kit's
commands work with no options.

The FSDP example's hand-written SGD (`nnx_impl.sgd.SGD`) keeps the trace of
`optax.chain(optax.ema(decay, debias=False), optax.scale(-lr))` as its
`momentum` and no `count` (it always equals the step). Importing this module
registers that correspondence with `converters.register_optimizer`, the way a
user registers an optimizer of their own.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from converters.api import linen_to_nnx, nnx_to_linen
from converters.checkpoint.inspect import CheckpointInfo, StoredLeaves
from converters.checkpoint.models import UserModels, check_rules
from converters.checkpoint.sides import CheckpointPlan, Side
from converters.errors import CheckpointError
from converters.optimizer_state import (
    NNX_OPTIMIZER,
    OptimizerCorrespondence,
    register_optimizer,
)
from converters.paths import Framework
from converters.presets import KIT_PATHS
from kit_mlp.description import GUIDE_RULES, ModelDescription
from kit_mlp.optimizers import make_tx
from nnx_impl.sgd import SGD

FSDP_SGD = OptimizerCorrespondence(
    'SGD (NNX FSDP example)', to_nnx={(0, 'ema'): ('momentum',)}, derived_from_step=((0, 'count'),)
)
register_optimizer(SGD, FSDP_SGD)

# The keys of the first optax state of each optimizer the kit trains with.
# adam and adamw keep the same arrays: a Linen checkpoint tells them apart by
# its number of (empty) optax states, an NNX one cannot (NNX drops empty
# states), so `with_optimizer` lets the caller say which.
_OPTAX_STATE_KEYS = {
    frozenset({'count', 'mu', 'nu'}): 'adam',
    frozenset({'trace'}): 'sgd_momentum',
    frozenset({'count', 'ema'}): 'fsdp_sgd',
}
# Optimizers whose states hold the same arrays.
_SAME_STATE = {
    'adam': 'adam', 'adamw': 'adam', 'sgd_momentum': 'sgd_momentum', 'fsdp_sgd': 'fsdp_sgd',
}
_LOOPED_LAYER = re.compile(r'DotReluDot_(\d+)$')


def correspondence_of_name(optimizer: str) -> OptimizerCorrespondence:
  """The correspondence of a `kit_mlp.optimizers` name ('fsdp_sgd' is the NNX SGD)."""
  return FSDP_SGD if optimizer == 'fsdp_sgd' else NNX_OPTIMIZER


@dataclasses.dataclass(frozen=True)
class KitCheckpoint:
  """What a checkpoint of the kit's MLP holds: layout, size, dtype, optimizer."""

  layout: str
  num_layers: int
  depth: int
  dtype: str
  optimizer: str

  def summary(self) -> dict:
    return dataclasses.asdict(self)


def _join(path: tuple[str, ...]) -> str:
  return '/'.join(path)


def _subkeys(leaves: StoredLeaves, prefix: tuple[str, ...]) -> set[str]:
  n = len(prefix)
  return {p[n] for p in leaves if p[:n] == prefix and len(p) > n}


def _shape(leaves: StoredLeaves, path: tuple[str, ...], path_text: str, rank: int) -> tuple[int, ...]:
  """The shape of the kernel at `path`, which must be there with `rank` dimensions."""
  hint = (
      'this is not a checkpoint of the kit\'s MLP; for a model of your own, '
      'give it (--linen-model and --nnx-model, or models=UserModels(linen_model, nnx_model, ...))'
  )
  if path not in leaves:
    raise CheckpointError(
        f'{path_text}: missing the parameter {_join(path)}; {hint}', [_join(path)]
    )
  shape = leaves[path][0]
  if len(shape) != rank:
    raise CheckpointError(
        f'{path_text}: {_join(path)} has shape {shape}, not rank {rank}; {hint}',
        [_join(path)],
    )
  return shape


def _model_of(leaves: StoredLeaves, framework: Framework, where: str) -> tuple[str, int, int, str]:
  """`(layout, num_layers, depth, dtype)` from the parameter leaves."""
  if framework == 'linen':
    tops = _subkeys(leaves, ('params',))
    if 'ScanDotReluDot_0' in tops:
      kernel = ('params', 'ScanDotReluDot_0', 'Dense_0', 'kernel', 'value')
      shape = _shape(leaves, kernel, where, 3)
      return 'scan', shape[0], shape[-1], leaves[kernel][1]
    kernel = ('params', 'DotReluDot_0', 'Dense_0', 'kernel', 'value')
    count = sum(1 for k in tops if _LOOPED_LAYER.match(k))
  else:
    tops = _subkeys(leaves, ('model', 'layers'))
    if 'dot1' in tops:
      kernel = ('model', 'layers', 'dot1', 'kernel', 'value')
      shape = _shape(leaves, kernel, where, 3)
      return 'scan', shape[0], shape[-1], leaves[kernel][1]
    kernel = ('model', 'layers', '0', 'dot1', 'kernel', 'value')
    count = sum(1 for k in tops if k.isdigit())
  shape = _shape(leaves, kernel, where, 2)
  return 'loop', count, shape[-1], leaves[kernel][1]


def _optimizer_of(info: CheckpointInfo) -> str:
  leaves, framework = info.leaves, info.framework
  if framework == 'nnx' and 'momentum' in _subkeys(leaves, ('optimizer',)):
    return 'fsdp_sgd'
  prefix = ('opt_state', '0') if framework == 'linen' else ('optimizer', 'opt_state', '0')
  keys = frozenset(_subkeys(leaves, prefix))
  if keys not in _OPTAX_STATE_KEYS:
    raise CheckpointError(
        f'{info.path}: {_join(prefix)} holds {sorted(keys)}, not the state of an '
        'optimizer the kit converts (adam or adamw: count, mu, nu; '
        'sgd_momentum: trace; fsdp_sgd: count, ema, or the NNX SGD momentum); '
        'for another optimizer give its optax transform (--optimizer '
        'pkg.module:make_tx, with --linen-model and --nnx-model)',
        [_join(prefix)],
    )
  found = _OPTAX_STATE_KEYS[keys]
  # chain(scale_by_adam, add_decayed_weights, scale): 3 states, adam's 2
  if found == 'adam' and framework == 'linen' and len(info.tree['opt_state']) == 3:
    return 'adamw'
  return found


def describe(info: CheckpointInfo, optimizer: str | None = None) -> KitCheckpoint:
  """The kit's MLP that `info` holds the training state of.

  `optimizer` names the optimizer when the state cannot tell (adam and adamw
  keep the same arrays; an NNX checkpoint drops adamw's empty states); it
  must keep the same state arrays as the checkpoint's.

  Raises:
    CheckpointError: not a training state of the kit's MLP.
  """
  layout, num_layers, depth, dtype = _model_of(info.leaves, info.framework, info.path)
  found = _optimizer_of(info)
  if optimizer is not None and optimizer != found:
    if info.framework == 'linen' and {optimizer, found} == {'adam', 'adamw'}:
      raise CheckpointError(
          f'{info.path}: holds the state of {found} ({"three" if found == "adamw" else "two"} '
          f'optax states), not of optimizer={optimizer!r} (adamw keeps three, adam two); '
          'drop the option or name the optimizer the checkpoint was trained with',
          ['opt_state'],
      )
    if _SAME_STATE.get(optimizer) != _SAME_STATE[found]:
      raise CheckpointError(
          f'{info.path}: holds the state of {found}, which is not the '
          f'state of optimizer={optimizer!r}; drop the option or name the '
          'optimizer the checkpoint was trained with'
      )
    found = optimizer
  return KitCheckpoint(layout, num_layers, depth, dtype, found)


def description(
    kit: KitCheckpoint,
    mesh_shape: tuple[int, int] = (2, 4),
    annotation: str = 'device',
    rules: tuple = GUIDE_RULES,
    layer_partition: str | None = None,
    layout: str | None = None,
) -> ModelDescription:
  """The `ModelDescription` of the checkpoint's MLP on `mesh_shape`.

  The annotation style, rules and layer partition are not stored in a
  checkpoint (only arrays are), so they come from the caller.
  `layer_partition` names the stacked layer axis, so it applies only when the
  layout (`layout`, or the checkpoint's own) is scanned; callers converting
  between layouts pass the same name for both sides.
  """
  use_scan = (layout or kit.layout) == 'scan'
  return ModelDescription(
      num_layers=kit.num_layers,
      depth=kit.depth,
      batch=mesh_shape[0],
      use_scan=use_scan,
      layer_partition=layer_partition if use_scan else None,
      annotation=annotation,
      rules=rules,
      mesh_shape=mesh_shape,
      dtype=kit.dtype,
  )


def check_layer_partition(layer_partition: str | None, layouts: list[str]) -> None:
  """Raises `CheckpointError` when a layer partition is given with no scanned side."""
  if layer_partition is not None and 'scan' not in layouts:
    raise CheckpointError(
        f'layer_partition={layer_partition!r} names the stacked layer axis, but '
        f'no side is scanned (layouts {layouts}); drop --layer-partition or '
        'convert to --layout scan'
    )


def trainer_for(framework: Framework, desc: ModelDescription, mesh, optimizer: str):
  """The Linen or NNX trainer whose training state a checkpoint holds."""
  if framework == 'linen':
    from linen_impl import train as linen_train

    return linen_train.make_trainer(desc, mesh, make_tx(optimizer))
  from nnx_impl import train as nnx_train

  return nnx_train.make_trainer(desc, mesh, optimizer)


def side_of(framework: Framework, trainer, optimizer: str = '') -> Side:
  """The `Side` of a kit trainer: what its `restore` fills, and its layout."""
  desc = trainer.desc
  layout = 'scan' if desc.use_scan else 'loop'
  what = f'the kit\'s {desc.num_layers}-layer, depth-{desc.depth} MLP' + (
      f' with {optimizer}' if optimizer else ''
  )
  if framework == 'linen':
    from linen_impl import checkpoint

    return Side('linen', checkpoint.restore_target(trainer), None, layout, what,
                trainer.desc.layer_partition)
  return Side('nnx', trainer.abstract_state, trainer.graphdef, layout, what,
              trainer.desc.layer_partition)


@dataclasses.dataclass(frozen=True)
class KitModels:
  """The kit's MLP, described by the checkpoint itself (the checkpoint tool's default).

  Attributes:
    mesh_shape: the `(data, model)` mesh to read, convert and write on.
    annotation, rules, layer_partition: the sharding annotations of the
      model (a checkpoint stores arrays only); see `ModelDescription`.
    optimizer: the optimizer SRC was trained with, when its state does not
      say (see `describe`); None: as the state says.
  """

  mesh_shape: tuple[int, int] = (2, 4)
  annotation: str = 'device'
  rules: tuple = GUIDE_RULES
  layer_partition: str | None = None
  optimizer: str | None = None

  def __post_init__(self):
    shape = self.mesh_shape
    if isinstance(shape, (str, bytes)) or len(tuple(shape)) != 2 or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape
    ):
      raise CheckpointError(
          f"mesh_shape={shape!r}: the kit's MLP runs on a ('data', 'model') mesh: give DATAxMODEL"
      )
    if self.optimizer is not None and not isinstance(self.optimizer, str):
      raise CheckpointError(
          "an optax optimizer is for your models: give them too (UserModels(linen_model, "
          "nnx_model, optimizer=...), or --linen-model and --nnx-model); the kit's MLP "
          'takes an optimizer name (adam, adamw, ...)'
      )
    if self.rules is None:
      raise CheckpointError("rules=None: the kit's MLP needs its logical rules (the default: GUIDE_RULES)")
    check_rules(self.rules)

  def describe(self, info: CheckpointInfo) -> KitCheckpoint:
    if info.weights:
      raise CheckpointError(
          f'{info.path}: holds weights only (no training state), and the kit\'s MLP is '
          'described by its training state',
          fix='give the models the weights are of (UserModels(linen_model, nnx_model, '
          'paths=...), or --linen-model, --nnx-model and --paths); no optimizer is needed',
      )
    return describe(info, self.optimizer)

  def summary(self, info: CheckpointInfo) -> dict:
    return self.describe(info).summary()

  def plan(
      self, info: CheckpointInfo, to: Framework | None = None, layout: str | None = None
  ) -> CheckpointPlan:
    """The sides of converting `info` to `to` in `layout` (None: SRC's)."""
    kit = self.describe(info)
    target_layout = layout or kit.layout
    check_layer_partition(self.layer_partition, [kit.layout, target_layout])
    args = (self.mesh_shape, self.annotation, self.rules, self.layer_partition)
    source_desc = description(kit, *args)
    target_desc = description(kit, *args, target_layout)
    mesh = source_desc.make_mesh()
    to = to or info.framework
    other_framework = 'nnx' if to == 'linen' else 'linen'

    def side(framework, desc):
      return side_of(framework, trainer_for(framework, desc, mesh, kit.optimizer), kit.optimizer)

    return CheckpointPlan(
        mesh=mesh,
        source=side(info.framework, source_desc),
        target=side(to, target_desc),
        other=side(other_framework, target_desc) if to == info.framework else None,
        paths=KIT_PATHS,
        rules=None,
        correspondence=correspondence_of_name(kit.optimizer),
    )

  def agreement(self) -> dict:
    return {
        'mesh': list(self.mesh_shape), 'annotation': self.annotation, 'rules': repr(self.rules),
        'layer_partition': self.layer_partition, 'optimizer': self.optimizer,
    }


def models_for(
    linen_model=None, nnx_model=None, *, paths=None, rules=None, optimizer=None,
    mesh_shape: tuple[int, ...] = (2, 4), mesh_axes: tuple[str, ...] = ('data', 'model'),
    annotation: str = 'device', layer_partition: str | None = None,
    collections=None,
) -> KitModels | UserModels:
  """The models a checkpoint is read as: the user's pair, or the kit's MLP when none is given.

  Raises:
    CheckpointError: one model of the pair without the other, or options
      that describe the kit's MLP given with a user's models.
  """
  if linen_model is None and nnx_model is None:
    if paths is not None:
      raise CheckpointError(
          'paths= maps the parameters of your models: give them too '
          '(linen_model= and nnx_model=, or --linen-model and --nnx-model)'
      )
    if collections is not None:
      raise CheckpointError(
          "collections= names your models' own collections: give the models too "
          '(linen_model= and nnx_model=)'
      )
    if tuple(mesh_axes) != ('data', 'model'):
      raise CheckpointError("the kit's MLP runs on a ('data', 'model') mesh: give DATAxMODEL")
    kit = dict(annotation=annotation, layer_partition=layer_partition, optimizer=optimizer)
    if rules is not None:
      kit['rules'] = rules
    return KitModels(tuple(mesh_shape), **kit)
  if linen_model is None or nnx_model is None:
    given, missing = ('linen', 'nnx') if nnx_model is None else ('nnx', 'linen')
    raise CheckpointError(
        f'{given}_model= is given without {missing}_model=: a checkpoint is '
        'converted between a Linen model and its NNX port; give both '
        f'(--{given}-model and --{missing}-model)'
    )
  if annotation != 'device' or layer_partition is not None:
    raise CheckpointError(
        "annotation= and layer_partition= describe the kit's MLP; your models "
        'carry their own annotations (give rules= for logical names)'
    )
  return UserModels(
      linen_model, nnx_model, paths=paths, rules=rules, optimizer=optimizer,
      mesh_shape=tuple(mesh_shape), mesh_axes=tuple(mesh_axes), collections=collections,
  )


# -- training states of the kit's trainers ----------------------------------------


def linen_to_nnx_state(
    state, nnx_trainer, scan: bool | None, layer_partition: str | None, donate: bool = False
):
  """A Linen `TrainState` of the kit's MLP as the NNX training state `nnx_trainer` saves."""
  model, optimizer = linen_to_nnx(
      state,
      target=side_of('nnx', nnx_trainer).objects(),
      scan=scan,
      layer_partition=layer_partition,
      donate=donate,
      paths=KIT_PATHS,
  )
  return nnx.state({'model': model, 'optimizer': optimizer})


def nnx_to_linen_state(
    state: nnx.State, nnx_trainer, linen_trainer, scan: bool | None,
    layer_partition: str | None, donate: bool = False,
):
  """An NNX training state of `nnx_trainer` as the `TrainState` of `linen_trainer`."""
  return nnx_to_linen(
      side_of('nnx', nnx_trainer).objects(state),
      target=linen_trainer.abstract_state,
      scan=scan,
      layer_partition=layer_partition,
      donate=donate,
      paths=KIT_PATHS,
  )


def start_from_linen(linen_trainer, nnx_trainer, seed: int = 0) -> tuple[Any, dict]:
  """A new Linen `TrainState` and the NNX training-state arrays converted from it.

  Linen and NNX draw different values from one seed, so to train both from
  identical parameters one side must come from the other. The NNX arrays are
  copies: a conversion shares Linen's buffers, and training donates them.
  Call with the trainers' mesh in context.
  """
  linen_state = linen_trainer.create(seed=seed)
  converted = linen_to_nnx_state(linen_state, nnx_trainer, None, None)
  return linen_state, jax.tree.map(jnp.copy, nnx.to_pure_dict(converted))
