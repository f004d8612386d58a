"""The models whose training states a checkpoint holds, as the checkpoint tool builds them.

A checkpoint stores arrays only: what they are (which parameters, which
optimizer state, how each is annotated and sharded) comes from the models.
A user describes a Linen model and its NNX port as they construct them:
`LinenModel(module, *example_args, **example_kwargs)` (`converters.linen_model`)
and a function that returns the NNX module, plus the path mapping, the
logical rules and the optax transform (`UserModels`). Neither model is ever
materialised: each side's training state is traced abstractly on the mesh
(`jax.eval_shape` of Linen's `init` and `TrainState.create`, `nnx.eval_shape`
of the NNX module and its `nnx.Optimizer`), with the sharding its annotations
give under the rules.

A training state is what Flax's examples save: a Linen `TrainState` (a
subclass with one field per collection `init` returns besides `params`, such
as `batch_stats`, as Flax's ImageNet example writes it), and for NNX the
`nnx.State` of `{'model': model, 'optimizer': nnx.Optimizer(model, tx,
wrt=nnx.Param)}`.

A factory that takes a `layout` argument (`'scan'` or `'loop'`) makes either
layout of its model, so one pair of factories serves scan <-> loop
conversions; the source side takes the layout that matches the checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import AxisType, Mesh

from converters import abstract_models
from converters.errors import CheckpointError, StructureError, format_offenders
from converters.inference import abstract_port, infer_linen_model, merge_layouts
from converters.linen_model import LAYOUTS, LinenModel, accepts_layout, split_arrays
from converters.linen_trees import TRAIN_STATE_FIELDS
from converters.metadata import is_linen_box
from converters.optimizer_state import NNX_OPTIMIZER
from converters.flat_trees import key_of, keys_of
from converters.paths import Framework, Infer, PathMapping, as_infer, as_mapping, format_path
from converters.checkpoint import weights
from converters.checkpoint.sides import CheckpointPlan, Side
from converters.sharding import linen_sharding

@functools.cache
def train_state_class(fields: tuple[str, ...]) -> type:
  """`TrainState` with one extra field per name, as a user writes it for `batch_stats`.

  One class per tuple of names, so that trees built from it compare equal.
  """
  if not fields:
    return TrainState
  namespace = {'__annotations__': dict.fromkeys(fields, Any), '__module__': __name__}
  return type('TrainState', (TrainState,), namespace)  # PyTreeNode: a dataclass


def _unset_fields(cls: type, collections: Mapping) -> dict[str, None]:
  """None for each required field of a `TrainState` subclass that is neither
  `TrainState`'s nor a collection: Flax's ImageNet example's `dynamic_scale`,
  None unless training in half precision. A checkpoint that holds arrays
  there is then reported leaf by leaf, as any other difference."""
  return {
      f.name: None
      for f in dataclasses.fields(cls)
      if f.init and f.name not in TRAIN_STATE_FIELDS and f.name not in collections
      and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
  }


class ModelPair(typing.Protocol):
  """A Linen model and its NNX port, as the checkpoint tool reads a checkpoint through them.

  `convert_checkpoint` and `compare_checkpoints` take any object with these
  members (`MODEL_PAIR_MEMBERS`); the `linen-nnx` command line builds one with
  `linen_nnx_cli.kit_models.models_for`. Two implementations: `UserModels`
  (your models, traced abstractly) and the command line's
  `linen_nnx_cli.kit_models.KitModels` (the kit's MLP, described by the
  checkpoint itself), which the checkpoint tool knows only through this
  interface. The plan must be of
  the checkpoint's framework, to the framework and layout asked for
  (`convert_checkpoint` checks).
  """

  def plan(self, info, to: Framework | None = None, layout: str | None = None) -> CheckpointPlan:
    """The sides of converting the checkpoint `info` describes to `to` in `layout`."""

  def summary(self, info) -> dict:
    """What the command line reports of the models for the checkpoint `info`."""

  def agreement(self) -> dict:
    """What every process must agree on (`converters.distributed.agree`), as JSON."""


#: What `ModelPair` asks of its implementations.
MODEL_PAIR_MEMBERS = ('plan', 'summary', 'agreement')


def check_model_pair(models: Any) -> ModelPair:
  """`models`, refused unless its class has every member of `ModelPair`.

  Read on the class, so that no property runs (`UserModels.mapping` may
  infer the mapping).
  """
  if models is None:
    raise CheckpointError(
        'models= is not given: a checkpoint holds arrays only, and the models say what '
        'they are; give the Linen model and its NNX port (UserModels(linen_model, '
        "nnx_model, paths=..., optimizer=...)); the kit's own MLP is "
        'linen_nnx_cli.kit_models.KitModels()'
    )
  if isinstance(models, type):
    raise CheckpointError(
        f'models={models.__name__}: give an instance (UserModels(linen_model, nnx_model, '
        "...)), not the class"
    )
  missing = [m for m in MODEL_PAIR_MEMBERS if not hasattr(type(models), m)]
  if missing:
    raise CheckpointError(
        f'models={models!r} lacks {missing}: give UserModels(linen_model, nnx_model, ...) '
        'for your models'
    )
  return models


def check_rules(rules) -> None:
  """Refuses logical axis rules that are not `(name, mesh axis or None)` pairs."""
  if isinstance(rules, (str, bytes)) or not all(
      isinstance(r, (tuple, list)) and len(r) == 2 and isinstance(r[0], str) for r in rules
  ):
    raise CheckpointError(
        f'rules={rules!r}: give logical axis rules as (name, mesh axis or None) '
        "pairs, e.g. (('embed', None), ('mlp', 'model'))"
    )


def _call(factory: Callable | Any, layout: str | None, what: str, *, nnx: bool = False) -> Any:
  """`factory(layout=layout)`, `factory()` when no layout is asked for; a
  model given as it is (not a function) makes its own layout only. `nnx`:
  the NNX model's factory, whose annotations name mesh axes."""
  if layout is None:
    return _called(factory, what, nnx=nnx) if callable(factory) else factory
  if not (callable(factory) and accepts_layout(factory)):
    raise CheckpointError(
        f'{what} makes one layout only (it takes no `layout` argument), so it '
        f'cannot give the {layout!r} layout asked for; give the factory a '
        "`layout='loop'|'scan'` parameter, or convert between models of the "
        'layouts you have'
    )
  return _called(factory, what, {'layout': layout}, nnx=nnx)


def _called(factory: Callable, what: str, kwargs: Mapping[str, Any] | None = None, *, nnx: bool = False) -> Any:
  """`factory(**kwargs)`, any error of the user's code said in one line (an
  NNX model's `ValueError` with how to fix an annotation naming no mesh axis)."""
  try:
    return factory(**(kwargs or {}))
  except CheckpointError:
    raise
  except Exception as e:  # the user's factory: any error of theirs
    raise CheckpointError(
        f'{what}: calling its factory failed: {type(e).__name__}: {e}'.strip(),
        fix=_UNRULED_FIX if nnx and isinstance(e, ValueError) else None,
    ) from e


#: How to fix a factory that failed on a ValueError: NNX takes an
#: annotation's name for a mesh axis, so a logical name with no rule fails
#: where the sharding is made, in JAX's words, before the tool can see it.
_UNRULED_FIX = (
    "if it names an axis that is not the mesh's (JAX's \"Resource axis: NAME of ... is not "
    'found in mesh\"), NAME is a logical name: give it a rule (--rules; (NAME, None) '
    'replicates it: Linen does so for a name with no rule, while NNX takes the name for a '
    'mesh axis)'
)

#: How to fix an optax transform whose init fails on the NNX parameters.
_OPTIMIZER_FIX = (
    'give the optax transform the checkpoint was trained with (optimizer=, --optimizer). NNX '
    "builds the optimizer state from the NNX model's parameters, so a tree written for the "
    "Linen parameters (optax.masked's mask, optax.multi_transform's labels) does not fit it; "
    'a function of the parameters (mask=lambda params: ...) builds, but the checkpoint tool '
    'cannot convert masked states yet: convert the parameters alone (a checkpoint of weights '
    "only, {'params': state.params})"
)


def _sharded(abstract: Any, shardings: Any) -> Any:
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )


# One annotation as the checks read it: (path, names, logical rules or None
# when the names are mesh axes).
Named = tuple[str, tuple, tuple | None]


def _linen_names(params, rules, prefix: str) -> list[Named]:
  """Every box of a Linen params tree: mesh-axis names, or logical names with
  the rules that resolve them (the box's own, else `rules`)."""
  out = []
  flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_linen_box)[0]
  for keypath, leaf in flat:
    path = format_path((prefix,) + keys_of(keypath))
    if isinstance(leaf, nn.LogicallyPartitioned):
      own = leaf.rules if leaf.rules is not None else rules
      out.append((path, tuple(leaf.names), tuple(own or ())))
    elif isinstance(leaf, nn.Partitioned):
      out.append((path, tuple(leaf.names), None))
  return out


def _linen_names_without_mesh(create, rngs, inputs, rules) -> list[Named]:
  try:
    with nn.logical_axis_rules(rules or ()):
      abstract = jax.eval_shape(create, rngs, inputs)
  except Exception:  # fails without the mesh too: not an annotation's doing
    return []
  return _linen_names(_params_of(abstract), rules, 'params')


def _nnx_names_without_mesh(create, rules) -> list[Named]:
  """Every annotated Variable of the NNX model, created without the mesh
  (eager sharding off): names that the rules (its own `sharding_rules`, else
  `rules`) name are logical, the others mesh axes, as NNX reads them."""
  try:
    with nnx.use_eager_sharding(False), nn.logical_axis_rules(rules or ()):
      objects = abstract_models.eval_shape(create, rerun_on_error=False)
  except Exception:  # fails without the mesh too: not an annotation's doing
    return []
  out = []
  for path, variable in nnx.to_flat_state(nnx.state(objects['model'])):
    names = variable.get_metadata().get('out_sharding')
    if not names:
      continue
    own = variable.get_metadata().get('sharding_rules') or rules or ()
    ruled = {name for name, _ in own}
    logical = any(n in ruled for n in names if isinstance(n, str))
    out.append((format_path(('model',) + tuple(path)), tuple(names), tuple(own) if logical else None))
  return out


def _check_annotations(named: list[Named], mesh: Mesh, what: str) -> None:
  """Refuses annotations the mesh cannot resolve, naming every parameter.

  A logical name with no rule: Linen replicates the dimension while NNX
  takes the name for a mesh axis, so the two would differ. A mesh-axis name
  the mesh lacks: neither side can place the parameter.
  """
  axes = set(mesh.axis_names)
  problems = []
  for path, names, rules in named:
    flat = [a for n in names for a in (n if isinstance(n, tuple) else (n,)) if a is not None]
    if rules is not None:
      ruled = {name for name, _ in rules}
      for name in (n for n in flat if n not in ruled):
        problems.append((path, f"{path}: logical name {name!r} has no rule"))
    else:
      for name in (n for n in flat if n not in axes):
        problems.append((path, f"{path}: names {name!r}, which the mesh {tuple(mesh.axis_names)} lacks"))
  if problems:
    raise CheckpointError(
        f'{what}: annotations the mesh cannot resolve: '
        f'{format_offenders(text for _, text in problems)}',
        list(dict.fromkeys(path for path, _ in problems)),
        fix='name the mesh axes the annotations use (--mesh-axes, mesh_axes=), and give '
        "a rule for every logical name (--rules; ('name', None) replicates it: Linen "
        'does so for a name with no rule, while NNX takes the name for a mesh axis)',
    )


def linen_side(
    model: LinenModel, tx: optax.GradientTransformation, mesh: Mesh, rules, paths: PathMapping,
    what: str = 'the Linen model',
) -> Side:
  """The Linen `TrainState` of `model` and `tx`, traced on `mesh` under `rules`;
  with `tx=None`, its weights: the variables `init` returns."""
  if not isinstance(model, LinenModel):
    raise CheckpointError(
        f'{what} must give a LinenModel(module, *example_inputs), got '
        f'{type(model).__name__}; wrap the module and the inputs its init takes'
    )
  # Array inputs (and ShapeDtypeStructs) are traced; the rest (train=False) stays static.
  rebuild, inputs = split_arrays(model.args, model.kwargs)

  def create(rngs, inputs):
    args, kwargs = rebuild(*inputs)
    variables = dict(model.module.init(rngs, *args, **kwargs))
    if tx is None:  # weights only
      return variables
    params = variables.pop('params', {})
    cls = model.train_state or train_state_class(tuple(sorted(variables)))
    return cls.create(
        apply_fn=model.module.apply, params=params, tx=tx, **variables,
        **_unset_fields(cls, variables),
    )

  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  try:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules or ()):
      abstract = jax.eval_shape(create, rngs, inputs)
  except CheckpointError:
    raise
  except Exception as e:  # the user's model: any error of theirs
    # An annotation the mesh cannot resolve fails inside Flax; traced
    # without the mesh, the boxes say which parameter names what.
    _check_annotations(_linen_names_without_mesh(create, rngs, inputs, rules), mesh, what)
    raise CheckpointError(
        f'{what}: tracing its init with the example inputs failed: '
        f'{type(e).__name__}: {e}'.strip()
    ) from e
  _check_annotations(_linen_names(_params_of(abstract), rules, 'params'), mesh, what)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules or ()):
    # The sharding tree stops at the boxes.
    shardings = jax.tree.map(
        functools.partial(linen_sharding, mesh, rules), abstract, is_leaf=is_linen_box
    )
  state = jax.tree.map(
      lambda s, boxed: _sharded(boxed, jax.tree.map(lambda _: s, boxed)), shardings, abstract
  )
  # Its own constants do not depend on the inputs' values: abstract ones are zeros.
  concrete = [jnp.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x for x in inputs]
  state = _linen_kept_values(state, paths, lambda: create(rngs, concrete), mesh, rules)
  param_paths = [
      tuple(str(key_of(k)) for k in keypath)
      for keypath, _ in jax.tree_util.tree_flatten_with_path(_params_of(abstract), is_leaf=is_linen_box)[0]
  ]
  layout = layout_of(paths, 'linen', param_paths)
  if tx is None:
    return Side('linen', state, None, layout, what, form='variables', standard=state)
  return Side('linen', state, None, layout, what)


def nnx_side(
    factory: Callable[[], nnx.Module], tx: optax.GradientTransformation, mesh: Mesh, rules,
    paths: PathMapping, what: str = 'the NNX model',
) -> Side:
  """The NNX model of `factory` and its `nnx.Optimizer`, traced on `mesh` under
  `rules`; with `tx=None`, its weights: the model's state."""

  def create():
    model = factory()
    if not isinstance(model, nnx.Module):
      raise CheckpointError(f'{what} returned {type(model).__name__}, not an nnx.Module')
    if tx is None:  # weights only
      return {'model': model}
    try:
      optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    except Exception as e:  # the user's optax transform: any error of its init
      raise CheckpointError(
          f'the optimizer: its init on the parameters of {what} failed: '
          f'{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ""}',
          fix=_OPTIMIZER_FIX,
      ) from e
    if any(isinstance(v.get_raw_value(), optax.MaskedNode) for _, v in nnx.to_flat_state(nnx.state(optimizer))):
      # Flax 0.12 cannot create them abstractly on a mesh (no array to shard).
      raise CheckpointError(
          'the optimizer: its state holds optax.MaskedNode parts (optax.masked, '
          'optax.multi_transform), which the checkpoint tool cannot convert yet: '
          'Flax cannot create them abstractly on a mesh',
          fix='convert a checkpoint of an unmasked optimizer, or the parameters alone (a '
          "checkpoint of weights only, {'params': state.params})",
      )
    return {'model': model, 'optimizer': optimizer}

  try:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules or ()):
      objects = abstract_models.eval_shape(create)
  except Exception as e:  # the user's model: any error of theirs
    if not isinstance(e, CheckpointError) or e.__cause__ is not None:
      # Eager sharding fails creating a Variable the mesh cannot place:
      # created without the mesh, the Variables say which parameter names what.
      _check_annotations(_nnx_names_without_mesh(create, rules), mesh, what)
    if isinstance(e, CheckpointError):
      raise
    if isinstance(e, StructureError):  # what the kit found wrong with the model
      raise CheckpointError(f'{what}: {e.problem}', list(e.paths), fix=e.fix) from e
    raise CheckpointError(
        f'{what}: creating it abstractly failed: {type(e).__name__}: {e}'.strip()
    ) from e
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules or ()):
    graphdef, state = nnx.split(objects)
    shardings = nnx.get_named_sharding(state, mesh)
  state = _nnx_kept_values(_sharded(state, shardings), paths, create, mesh, rules)
  param_paths = [
      tuple(str(k) for k in path)
      for path, _ in nnx.to_flat_state(nnx.state(objects['model'], nnx.Param))
  ]
  layout = layout_of(paths, 'nnx', param_paths)
  if tx is None:
    model_graphdef = nnx.graphdef(objects['model'])
    return Side('nnx', state['model'], model_graphdef, layout, what, form='model', standard=state['model'])
  return Side('nnx', state, graphdef, layout, what)


def _nnx_kept_values(state: nnx.State, paths: PathMapping, create, mesh: Mesh, rules) -> nnx.State:
  """`state` holding the values of the state only NNX has (a one-sided rule
  names it, `PathRule.nnx_only('pos_table')`), as the factory makes them: a
  conversion into NNX keeps them, as it keeps a real target's."""
  flat = list(nnx.to_flat_state(state))
  kept = [p for p, _ in flat if p[0] == 'model' and paths.only('nnx', tuple(p[1:]))]
  if not kept:
    return state

  raw = lambda v: v.get_raw_value() if isinstance(v, nnx.Variable) else v  # an array attribute
  leaves = dict(flat)
  shardings = [getattr(raw(leaves[p]), 'sharding', None) for p in kept]
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules or ()):
    arrays = dict(zip(kept, abstract_models.made_values(create, kept, shardings)))
  return nnx.from_flat_state([
      (p, (v.replace(arrays[p]) if isinstance(v, nnx.Variable) else arrays[p]) if p in arrays else v)
      for p, v in flat
  ])


def _linen_kept_values(state: TrainState, paths: PathMapping, create, mesh: Mesh, rules) -> TrainState:
  """`state` holding the values of the state only Linen has (a one-sided rule
  names it in a collection, `PathRule.linen_only('pos_table')`), as `init` makes them."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_linen_box)
  collections = {'params'} | set(_extra_collections(state))
  kept = [
      i for i, (keypath, _) in enumerate(leaves)
      if str(key_of(keypath[0])) in collections and paths.only('linen', keys_of(keypath[1:]))
  ]
  if not kept:
    return state

  def values() -> list:
    made = jax.tree_util.tree_leaves(create(), is_leaf=is_linen_box)
    return [made[i].unbox() if is_linen_box(made[i]) else made[i] for i in kept]

  unboxed = [leaves[i][1].value if is_linen_box(leaves[i][1]) else leaves[i][1] for i in kept]
  # Under jax.jit, as abstract_models.made_values makes NNX's: nothing else is materialised.
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules or ()):
    made = jax.jit(values, out_shardings=[a.sharding for a in unboxed])()
  arrays = dict(zip(kept, made))
  filled = [
      (leaf.replace_boxed(arrays[i]) if is_linen_box(leaf) else arrays[i]) if i in arrays else leaf
      for i, (_, leaf) in enumerate(leaves)
  ]
  return jax.tree.unflatten(treedef, filled)


def _extra_collections(state: TrainState | dict) -> list[str]:
  """The collection fields of a `TrainState` subclass (`batch_stats`), or
  the collections of Linen variables."""
  if isinstance(state, Mapping):
    return list(state)
  return [f.name for f in dataclasses.fields(state) if f.name not in TRAIN_STATE_FIELDS]


def _params_of(state: TrainState | dict) -> Any:
  """The params tree of a Linen `TrainState` or of Linen variables."""
  return state.get('params', {}) if isinstance(state, Mapping) else state.params


def layout_of(paths: PathMapping, framework: Framework, param_paths) -> str | None:
  """'scan' or 'loop' as `paths` reads the parameters; None when no layer repeats."""
  param_paths = list(param_paths)
  bound = paths.bound(framework, param_paths)
  layouts = {
      m.layout for p in param_paths for m in bound.match_all(framework, p)
  } & set(LAYOUTS)
  if len(layouts) > 1:
    raise CheckpointError(
        f'the {framework} model has both stacked and looped layers as the path '
        'mapping reads them; the checkpoint tool converts models of one layout'
    )
  return layouts.pop() if layouts else None


def _name(obj: Any) -> str:
  if isinstance(obj, LinenModel):
    return type(obj.module).__name__
  return f'{getattr(obj, "__module__", "?")}.{getattr(obj, "__qualname__", repr(obj))}'


def _multi_steps_hint(obj) -> str:
  if isinstance(obj, optax.MultiSteps):
    return '; for optax.MultiSteps, give its .gradient_transformation()'
  return ''


@dataclasses.dataclass(frozen=True)
class UserModels:
  """A Linen model and its NNX port, as `convert_checkpoint` and `compare_checkpoints` take them.

  Attributes:
    linen: a `LinenModel`, or a function returning one (taking `layout=`
      to make either layout).
    nnx: a function returning the NNX module (taking `layout=` likewise);
      it is only ever called under `nnx.eval_shape`.
    paths: the Linen <-> NNX path mapping (None: every path kept; 'infer':
      derived from what the two models compute: both layouts for factories
      that take `layout=`, else each side in its own model's layout;
      `Infer(known)`: the same, with the rules you know taking precedence).
    rules: the logical axis rules both models are annotated under (Flax's
      `nn.logical_axis_rules` context around creation, conversion and
      restore).
    optimizer: the optax transform the checkpoint was trained with, or a
      function returning it; its state's structure must match the checkpoint.
    mesh_shape: the shape of the mesh to read, convert and write on.
    mesh_axes: the names of its axes.
    collections: `{Linen collection: nnx.Variable subclass}` for the models'
      own collections beyond `params`, `batch_stats` and `cache`.
  """

  linen: LinenModel | Callable[..., LinenModel]
  nnx: Callable[..., nnx.Module]
  paths: PathMapping | Infer | str | None = None
  rules: tuple | None = None
  optimizer: optax.GradientTransformation | Callable[[], optax.GradientTransformation] | None = None
  mesh_shape: tuple[int, ...] = (2, 4)
  mesh_axes: tuple[str, ...] = ('data', 'model')
  collections: Mapping[str, type] | None = None

  def __post_init__(self):
    if self.rules is not None:
      check_rules(self.rules)
    if isinstance(self.optimizer, str):
      raise CheckpointError(
          f'optimizer={self.optimizer!r} names one of the kit\'s optimizers; for your '
          'models give the optax transform, or a function returning it '
          '(--optimizer pkg.module:make_tx)'
      )
    if self.collections is not None and not (
        isinstance(self.collections, Mapping)
        and all(isinstance(t, type) and issubclass(t, nnx.Variable) for t in self.collections.values())
    ):
      raise CheckpointError(
          f'collections={self.collections!r}: give {{collection name: nnx.Variable '
          "subclass}, e.g. {'counters': Counter}"
      )

  @functools.cached_property
  def mapping(self) -> PathMapping:
    if self.paths is None:
      return PathMapping.identity()
    infer = as_infer(self.paths)
    if infer is not None:
      return self.inferred(paths=infer.known)
    if isinstance(self.paths, str):
      raise CheckpointError(
          f"paths={self.paths!r}: give a PathMapping, or 'infer' (Infer(known_rules)) to "
          'derive it from what the two models compute'
      )
    return as_mapping(self.paths)

  def inferred(self, layout: str | None = None, paths=None) -> PathMapping:
    """The path mapping of the two models, from what they compute
    (`converters.infer_paths`), both made in `layout`; rules given as `paths`
    take precedence. With no layout, factories that make both give one
    mapping for both (`merge_layouts`), others their own layout's."""
    if layout is None and all('scan' in self.layouts(fw) for fw in ('linen', 'nnx')):
      return merge_layouts(self.inferred('loop', paths), self.inferred('scan', paths))
    mesh = self.make_mesh()
    linen = self.linen_model(layout if 'scan' in self.layouts('linen') else None)
    make = functools.partial(
        _call, self.nnx, layout if 'scan' in self.layouts('nnx') else None, 'the NNX model', nnx=True,
    )
    with jax.set_mesh(mesh), nn.logical_axis_rules(self.rules or ()):
      model = abstract_port(make, self.collections)
      model.eval()  # the mapping of the computation without dropout
      return infer_linen_model(linen, model, paths=paths, collections=self.collections)

  def make_mesh(self) -> Mesh:
    if len(self.mesh_shape) != len(self.mesh_axes):
      raise CheckpointError(
          f'mesh shape {tuple(self.mesh_shape)} and axes {tuple(self.mesh_axes)} differ in '
          'length; give one size per axis'
      )
    needed, found = math.prod(self.mesh_shape), jax.device_count()
    if needed != found:
      raise CheckpointError(
          f'mesh {"x".join(map(str, self.mesh_shape))} needs {needed} devices, '
          f'this process sees {found}; give a mesh of {found} devices (--mesh)'
      )
    return jax.make_mesh(
        tuple(self.mesh_shape), tuple(self.mesh_axes),
        axis_types=(AxisType.Auto,) * len(self.mesh_axes),
    )

  def tx(self) -> optax.GradientTransformation:
    if self.optimizer is None:
      raise CheckpointError(
          'the optimizer is not given: a training state holds its state, so the '
          'checkpoint tool needs the optax transform it was trained with '
          '(optimizer=make_tx, or --optimizer pkg.module:make_tx)'
      )
    if isinstance(self.optimizer, optax.GradientTransformation):
      return self.optimizer
    if not callable(self.optimizer):
      raise CheckpointError(
          f'the optimizer is a {type(self.optimizer).__name__}, not an optax '
          'GradientTransformation or a function returning one'
          + _multi_steps_hint(self.optimizer)
      )
    tx = _called(self.optimizer, 'the optimizer')
    if not isinstance(tx, optax.GradientTransformation):
      raise CheckpointError(
          f'the optimizer function returned {type(tx).__name__}, not an optax '
          'GradientTransformation' + _multi_steps_hint(tx)
      )
    return tx

  def layouts(self, framework: Framework) -> tuple[str | None, ...]:
    """The layouts this side's factory can make (None: only its own)."""
    factory = self.linen if framework == 'linen' else self.nnx
    return LAYOUTS if callable(factory) and accepts_layout(factory) else (None,)

  def side(
      self, framework: Framework, mesh: Mesh, layout: str | None = None, weights: bool = False,
  ) -> Side:
    """The `framework` side, in `layout` (None: the factory's own); its
    training state, or with `weights` its weights (no optimizer needed).

    Made once per pair of models: finding a checkpoint's layout or form,
    planning its conversion and comparing two checkpoints ask for the same
    sides, each an abstract trace of the user's model (and a compilation
    for state only one side has)."""
    key = (framework, mesh, layout, weights)
    if key not in self._sides:
      self._sides[key] = self._side(framework, mesh, layout, weights)
    return self._sides[key]

  @functools.cached_property
  def _sides(self) -> dict:
    return {}

  def _side(self, framework: Framework, mesh: Mesh, layout: str | None, weights: bool) -> Side:
    tx = None if weights else self.tx()
    factory = self.linen if framework == 'linen' else self.nnx
    what = f'the {"Linen" if framework == "linen" else "NNX"} model ({_name(factory)})'
    fixed = layout is not None and self.layouts(framework) == (None,)
    make = None if fixed else layout
    if framework == 'linen':
      side = linen_side(_call(factory, make, what), tx, mesh, self.rules, self.mapping, what)
    else:
      side = nnx_side(
          functools.partial(_call, factory, make, what, nnx=True), tx, mesh, self.rules, self.mapping, what
      )
    if fixed and side.layout not in (layout, None):
      _call(factory, layout, what, nnx=framework == 'nnx')  # raises: it makes one layout, not this one
    return side

  def source_side(self, info, mesh: Mesh) -> Side:
    """The side whose training state `info` holds, in the layout it holds.

    Raises:
      CheckpointError: the checkpoint does not hold that side's training
        state, listing every leaf missing, unexpected or of another shape
        or dtype (for a factory of both layouts, against the nearer one).
    """
    return self.source_layout(info, mesh)[1]

  def source_layout(self, info, mesh: Mesh) -> tuple[str | None, Side]:
    """`(layout, side)`: `source_side` and the layout its factory was asked
    for (None: the factory's own). For weights only, the side and form
    whose tree the checkpoint holds, of either framework
    (`converters.checkpoint.weights`)."""
    from converters.checkpoint import inspect as checkpoints

    if info.weights:
      return weights.find_source(self, info, mesh)
    found = []
    for layout in self.layouts(info.framework):
      side = self.side(info.framework, mesh, layout)
      problems = checkpoints.differences(info.leaves, checkpoints.leaves_of(side.abstract_state))
      if not any(problems):
        return layout, side
      found.append((sum(map(len, problems)), side))
    side = min(found, key=lambda f: f[0])[1]
    checkpoints.check_structure(
        info, checkpoints.leaves_of(side.abstract_state), side.what + ' with the given optimizer'
    )
    raise AssertionError('unreachable: check_structure raised')

  def linen_model(self, layout: str | None) -> LinenModel:
    """The Linen model (module and example inputs) in `layout` (None: its own)."""
    linen = _call(self.linen, layout, f'the Linen model ({_name(self.linen)})')
    if not isinstance(linen, LinenModel):
      raise CheckpointError(
          f'the Linen model must give a LinenModel(module, *example_inputs), got '
          f'{type(linen).__name__}'
      )
    return linen

  def plan(self, info, to: Framework | None = None, layout: str | None = None) -> CheckpointPlan:
    """The sides of converting `info` to `to` in `layout` (None: SRC's)."""
    mesh = self.make_mesh()
    source = self.source_side(info, mesh)
    to = to or source.framework
    # By default the source's layout, or, for a port whose factory makes one
    # layout, that one (a Linen model that scans beside a port that loops).
    own = to != source.framework and self.layouts(to) == (None,)
    target_layout = layout or (None if own else source.layout)
    target = self.side(to, mesh, target_layout, weights=source.weights)
    if source.weights:
      target = weights.target_form(source, target)
    if layout is not None and target.layout is None:
      raise CheckpointError(
          f'layout {layout!r} asked for, but the {to} model has no layers as the path '
          'mapping reads them (no rule with {i} matches its parameters); leave the '
          'layout out, or give a mapping with layer rules'
      )
    if target.layout not in (None, source.layout):
      lacking = [  # a one-sided rule of the other side has no form here, nor needs one
          r.template(to, source.layout) or r.template(source.framework, source.layout)
          for r in self.mapping.rules
          if r.only in (None, to) and r.missing_form(to, target.layout)
      ]
      if lacking:
        raise CheckpointError(
            f'this conversion goes from {source.layout} to {target.layout}, and the path '
            f'mapping has no {target.layout} form on the {to} side for '
            f'{format_offenders(lacking)}; '
            + ("paths='infer' infers both layouts when both factories take layout=, or "
               'maps a model of one layout to a port of the other'
               if as_infer(self.paths) is not None else
               f'add {to}_stacked= / {to}= (looped, with {{i}}) to those rules')
        )
    other = None
    if to == source.framework:
      other = self.side('nnx' if to == 'linen' else 'linen', mesh, target_layout, weights=source.weights)
      if source.weights:
        other = weights.target_form(source, other)
    return CheckpointPlan(
        mesh, source, target, other, self.mapping, self.rules, NNX_OPTIMIZER, self.collections
    )

  def summary(self, info) -> dict:
    return {'models': {'linen': _name(self.linen), 'nnx': _name(self.nnx)}}

  def agreement(self) -> dict:
    return {
        'mesh': list(self.mesh_shape), 'mesh_axes': list(self.mesh_axes),
        'models': [_name(self.linen), _name(self.nnx)], 'rules': repr(self.rules),
        'paths': repr(self.mapping), 'collections': repr(self.collections),
    }
