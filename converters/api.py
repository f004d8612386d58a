"""`linen_to_nnx`, `nnx_to_linen` and `relayout`: variables, optimizer state and metadata.

Linen side: a variables dict of collections (`{'params': ..., 'batch_stats':
..., 'cache': ...}`, boxed or bare) or a `TrainState`, whose extra fields
(`batch_stats`) are collections too. NNX side: an `nnx.State` (what
`nnx.update(model, state)` takes), a model, or a `(model, optimizer)` pair.
Converting optimizer state needs the other side's structure, given as
`target`: an NNX `(model, optimizer)` (real or from `nnx.eval_shape`) or a
Linen `TrainState` (real or from `jax.eval_shape`). Targets are templates
only: they are never modified; their annotations must resolve to the same
mesh `PartitionSpec` as the converted ones, and the output takes the
target's form of each annotation.

Each conversion is a short run of one pipeline: the mapping resolved
(`converters.resolution`), each framework's trees read (`converters.linen_trees`,
`converters.nnx_trees`), every tree planned and checked, then built
(`converters.conversion`), and a target filled (`converters.filling`).
Optimizer state takes the same stages (`converters.optimizer_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import Mesh

from converters import linen_trees, nnx_trees, optimizer_state
from converters.conversion import Conversion
from converters.errors import StructureError
from converters.filling import fill, scalar_like
from converters.linen_model import LinenModel
from converters.options import Options
from converters.paths import PathMapping
from converters.resolution import resolve_mapping
from converters.sharding import mesh_of, mesh_of_tree, placement_mesh
from converters.variable_types import CollectionTable


def linen_to_nnx(
    linen: Mapping | TrainState, *, target: Any = None, paths: PathMapping | str | None = None,
    scan: bool | None = None, layer_partition: str | None = None, num_layers: int | None = None,
    mesh: Mesh | None = None, rules: tuple | None = None, donate: bool = False, strict: bool = False,
    collections: Mapping[str, type] | None = None, rngs: int | Mapping[str, Any] | None = None,
    linen_model: LinenModel | Callable[..., LinenModel] | None = None,
    nnx_model: nnx.Module | Callable[..., nnx.Module] | None = None,
    placement: str | None = None, wrt: Any = None,
):
  """Converts Linen variables or a `TrainState` to NNX.

  Args:
    linen: a variables dict of collections, boxed or bare (`{'params': ...,
      'batch_stats': ..., 'cache': ...}`), or a `TrainState` (a subclass's
      extra fields, such as `batch_stats`, are collections).
    target: NNX structure to fill: a model, or `(model, optimizer)` (needed for
      a `TrainState`); real or abstract (`nnx.eval_shape`). Not modified. Its
      RNG state (`nnx.Rngs` streams) is kept as it is: Linen has none.
    paths: the path mapping, which maps every collection; it and `scan`,
      `layer_partition`, `num_layers`, `mesh`, `rules`, `donate`, `strict`
      and `placement` are described in `converters.options.Options`. Into a
      target, `placement` defaults to `'reshard'` on the target's mesh:
      input arrays placed otherwise than their annotations say (a model
      initialised without `out_shardings`) go where the target's do.
    collections: `{collection name: nnx.Variable subclass}` for collections
      beyond `params`, `batch_stats` and `cache`.
    rngs: seeds for the target's RNG streams (`nnx.reseed`): an int, or
      `{stream: seed or key}`. Needed when the target's RNG state is abstract
      (from `nnx.eval_shape`); without it a real target's RNG state is kept.
    linen_model: with `paths='infer'`, the Linen model the variables are
      of: `LinenModel(module, *example_inputs)`, or a function returning one.
    nnx_model: with `paths='infer'`, the NNX port (default: the target's
      model), or a function returning it. Functions with a `layout`
      parameter (`'loop'`/`'scan'`) on both sides give the mapping of both
      layouts; models of one layout each map in their own.
    wrt: with a model `target`, an `nnx` filter (`nnx.Param`) of the
      Variables to fill, for weights without the rest (`{'params': ...}`
      into a model with batch statistics); the target's other Variables are
      kept as they are, abstract ones too (`nnx.state(model, nnx.Param)` of
      the result is then what was converted).

  Returns:
    Without `target`, an `nnx.State` (for `nnx.update`); else a new model, or
    `(model, optimizer)`. Arrays whose layout does not change are the input's.

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  options = _options(
      paths, linen_model, nnx_model, target, collections, target=target, source=linen, scan=scan,
      layer_partition=layer_partition, num_layers=num_layers, mesh=mesh, rules=rules,
      donate=donate, strict=strict, placement=placement,
  )
  table = CollectionTable(collections)
  trees = linen_trees.input_collections(linen, table, only=_only(options, 'linen'))
  model, optimizer = nnx_trees.split_target(target, train_state=isinstance(linen, TrainState))
  _check_wrt(wrt, model, optimizer)
  flats = {name: linen_trees.read_collection(tree, name, strict=options.strict) for name, tree in trees.items()}
  if 'params' in flats:
    _nonempty(flats['params'], 'params')
  if isinstance(linen, TrainState):
    linen_trees.check_untrained(linen.params, _only(options, 'linen'), 'params')
  conversion = Conversion(options)
  converted = conversion.add_collections(
      flats, 'linen', 'nnx',
      target_paths=None if model is None else lambda: nnx_trees.model_param_paths(model),
      target_leaves=None if model is None else lambda: nnx_trees.model_variable_shapes(model),
  )
  if model is None:
    conversion.run()
    return nnx_trees.write_state(converted, table.by_name, conversion.value)
  return _into_nnx_target(
      linen, flats, converted, conversion, model=model, optimizer=optimizer, table=table, rngs=rngs, wrt=wrt,
  )


def _check_wrt(wrt, model, optimizer) -> None:
  """`linen_to_nnx`'s `wrt=`, before anything is read: an nnx filter, with a model alone as target."""
  if wrt is None:
    return
  if model is None or optimizer is not None:
    raise StructureError(
        'wrt= selects the Variables of a target model to fill; give a model alone as '
        'target (a training state fills all of them, and without a target nothing is filled)'
    )
  try:
    nnx.filterlib.to_predicate(wrt)
  except (TypeError, ValueError) as e:
    raise StructureError(f'wrt={wrt!r}: not an nnx filter ({e}); pass nnx.Param, say') from e


def _into_nnx_target(linen, flats: dict, converted: dict, conversion: Conversion, *, model, optimizer,
                     table: CollectionTable, rngs, wrt):
  """`linen_to_nnx` into a target: its model's (and optimizer's) leaves filled, a new model or pair."""
  options = conversion.options
  template = nnx_trees.Template.of(
      model, optimizer, rules=options.resolution_rules, rngs=rngs, only=_only(options, 'nnx'), wrt=wrt,
  )
  produced = {('model',) + p: leaf for flat in converted.values() for p, leaf in flat.items()}
  if optimizer is not None:
    produced.update(optimizer_state.linen_opt_to_nnx(linen, flats.get('params', {}), optimizer, conversion))
  filled = fill(
      'linen -> nnx', template.leaves, produced, options=options,
      mesh=options.mesh or mesh_of_tree(template.variables),
      explain=lambda p, _: options.paths.describe('nnx', p[1:]) if p[0] == 'model' else None,
      check_kind=template.check_kind(table, converted), check_metadata=template.check_metadata,
  )
  conversion.protect(_scalars(produced, filled))
  conversion.run()
  return template.merge(filled, conversion.value)


def nnx_to_linen(
    nnx_in, *, target: TrainState | Mapping | None = None, paths: PathMapping | str | None = None,
    scan: bool | None = None, layer_partition: str | None = None, num_layers: int | None = None,
    mesh: Mesh | None = None, rules: tuple | None = None, donate: bool = False, strict: bool = False,
    collections: Mapping[str, type] | None = None,
    linen_model: LinenModel | Callable[..., LinenModel] | None = None,
    nnx_model: nnx.Module | Callable[..., nnx.Module] | None = None,
    placement: str | None = None,
):
  """Converts an NNX state, model or `(model, optimizer)` to Linen.

  Args:
    nnx_in: an `nnx.State`, a model, or `(model, optimizer)`. Every Variable
      goes to the collection of its type; RNG state is left out (Linen has
      none).
    target: with an optimizer, a `TrainState` (real, or from
      `jax.eval_shape`) whose `tx`, `apply_fn`, `opt_state` and collection
      fields (`batch_stats`) to fill; without one, optionally Linen variables
      (`{collection: tree}`, real or abstract) whose annotations the output
      takes. Not modified.
    paths: as in `linen_to_nnx`, as are `scan`, `layer_partition`,
      `num_layers`, `mesh`, `rules`, `donate`, `strict`, `collections` and
      `placement`.
    linen_model: with `paths='infer'`, as in `linen_to_nnx`.
    nnx_model: with `paths='infer'`, as in `linen_to_nnx`; defaults to the
      input's model (needed for an `nnx.State`).

  Returns:
    Without an optimizer: `{collection: boxed tree}` (`{'params': ...}` for
    a model of parameters only), in the target's annotation form if given.
    With one: a new `TrainState`. Arrays whose layout does not change are the
    input arrays.

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  state, optimizer = nnx_trees.split_input(nnx_in)
  options = _options(
      paths, linen_model, nnx_model, nnx_in, collections, target=target, source=nnx_in, scan=scan,
      layer_partition=layer_partition, num_layers=num_layers, mesh=mesh, rules=rules,
      donate=donate, strict=strict, placement=placement,
  )
  table = CollectionTable(collections)
  linen_trees.check_target(target, has_optimizer=optimizer is not None)
  groups = nnx_trees.state_collections(
      state, table, options.resolution_rules, 'model', only=_only(options, 'nnx'),
  )
  if optimizer is not None:
    only = _only(options, 'nnx')
    nnx_trees.check_untrained(
        {tuple(p): v for p, v in nnx.to_flat_state(state) if only(tuple(p))}, optimizer, 'model',
    )
  if optimizer is not None or not groups:
    _nonempty(groups.get('params', {}), 'model')
  conversion = Conversion(options)
  params = linen_trees.target_params(target)
  converted = conversion.add_collections(
      groups, 'nnx', 'linen',
      target_paths=None if params is None else lambda: linen_trees.tree_param_paths(params),
      target_leaves=None if target is None else lambda: linen_trees.variable_shapes(target),
  )
  if target is None:
    conversion.run()
    return linen_trees.write_collections(_nonempty_collections(converted), conversion.value)

  templates = linen_trees.templates_of(target, table, groups, only=_only(options, 'linen'))
  if optimizer is not None:
    linen_trees.check_untrained(templates['params'], _only(options, 'linen'), 'target.params')
  filled = _filled_linen_templates(templates, converted, conversion)
  if optimizer is None:
    conversion.run()
    return linen_trees.write_collections(filled, conversion.value)
  return _train_state(target, optimizer, groups['params'], filled, conversion)


def _filled_linen_templates(templates: dict, converted: dict, conversion: Conversion) -> dict:
  """`nnx_to_linen` into a target: each collection of its templates filled, in the order produced."""
  options = conversion.options
  filled = {}
  for c in sorted(templates):
    template = linen_trees.read_collection(templates[c], f'target.{c}')
    produced = {**converted.get(c, {}), **linen_trees.kept_from_target(template, _only(options, 'linen'), c)}
    filled[c] = fill(
        f'nnx -> linen {c}', template, produced, options=options, prefix=f'{c}/',
        explain=lambda p, _: options.paths.describe('linen', p),
        in_produced_order=True,
    )
  return filled


def relayout(
    tree, *, scan: bool, paths: PathMapping | str | None = None,
    layer_partition: str | None = None, num_layers: int | None = None, mesh: Mesh | None = None,
    rules: tuple | None = None, donate: bool = False, strict: bool = False,
    collections: Mapping[str, type] | None = None,
    linen_model: Callable[..., LinenModel] | None = None,
    nnx_model: Callable[..., nnx.Module] | None = None,
    placement: str | None = None,
):
  """Scanned <-> looped within one framework, for variables.

  Args:
    tree: Linen variables `{collection: boxed tree}` or an `nnx.State`
      (without RNG state: split it off with `nnx.state(model, nnx.Not(nnx.RngState))`).
    scan: True to stack the layers, False to unstack them.
    paths: as in `linen_to_nnx`, as are `layer_partition`, `num_layers`,
      `mesh`, `rules`, `donate`, `strict`, `collections` and `placement`
      (no target here: `placement` is `'check'` by default).
    linen_model: with `paths='infer'`, a function with a `layout` parameter
      (`'loop'`/`'scan'`) making the Linen model (a `LinenModel`).
    nnx_model: with `paths='infer'`, a function with a `layout` parameter
      making the NNX port: the mapping of both layouts is inferred from the
      two.

  Returns:
    The same kind of tree in the other layout. For a whole training state,
    convert through the other framework with targets in the wanted layout.
  """
  options = _options(
      paths, linen_model, nnx_model, None, collections, both_layouts=True, scan=scan,
      layer_partition=layer_partition, num_layers=num_layers, mesh=mesh, rules=rules,
      donate=donate, strict=strict, placement=placement,
  )
  table = CollectionTable(collections)
  conversion = Conversion(options)
  if isinstance(tree, nnx.State):
    flat = nnx_trees.read_state(tree, 'model', options.resolution_rules)
    groups, types = nnx_trees.groups_by_type(_nonempty(flat, 'model'), table, only=_only(options, 'nnx'))
    converted = conversion.add_collections(groups, 'nnx', 'nnx')
    conversion.run()
    return nnx_trees.write_state(converted, types, conversion.value)
  if isinstance(tree, Mapping):
    trees = linen_trees.input_collections(tree, table, only=_only(options, 'linen'))
    flats = {name: linen_trees.read_collection(t, name, strict=options.strict) for name, t in trees.items()}
    converted = conversion.add_collections(flats, 'linen', 'linen')
    conversion.run()
    return linen_trees.write_collections(_nonempty_collections(converted), conversion.value)
  raise StructureError(
      "relayout takes Linen variables ({'params': ...}) or an nnx.State, got "
      f'{type(tree).__name__}'
  )


def _options(
    paths, linen_model, nnx_model, at_hand, collections, *, both_layouts=False, target=None,
    source=None, placement=None, **given,
) -> Options:
  """The conversion's `Options`, its path mapping resolved once; `at_hand` is
  the target or input, whose model `paths='infer'` uses unless given one.
  Into a target, `placement` defaults to `'reshard'`, on its mesh if it has one."""
  model = at_hand[0] if isinstance(at_hand, tuple) and at_hand else at_hand
  mapping = resolve_mapping(
      paths, linen_model=linen_model, nnx_model=nnx_model,
      default_nnx_model=model if isinstance(model, nnx.Module) else None,
      mesh=given['mesh'], rules=given['rules'], collections=collections,
      both_layouts=both_layouts,
  )
  if target is not None and placement in (None, 'reshard'):
    # Into a target: its mesh (an abstract target's, found), where its arrays go.
    target_mesh = _mesh_of(target)
    given['unplaced_stay'] = placement is None and target_mesh is None
    placement = 'reshard'
    if given['mesh'] is None and target_mesh is not None:
      given['mesh'] = _concrete(target_mesh, source)
  return Options(paths=mapping, placement='check' if placement is None else placement, **given)


def _only(options: Options, framework: str) -> Callable[[tuple], bool]:
  """Whether a path is state only `framework` has (a one-sided rule names it)."""
  return lambda path: options.paths.only(framework, path)


def _mesh_of(tree):
  """The mesh (concrete or abstract) of the first sharded leaf of a target or
  input (for a model or `(model, optimizer)`, the model's), or None."""
  model = tree[0] if isinstance(tree, tuple) and tree else tree
  leaves = jax.tree.leaves(nnx.state(model) if isinstance(model, nnx.Module) else tree)
  return next((m for m in map(mesh_of, leaves) if m is not None), None)


def _concrete(mesh, source) -> Mesh | None:
  """`mesh`, or for the abstract mesh of a target from `nnx.eval_shape` /
  `jax.eval_shape`, the concrete mesh it stands for: the enclosing
  `jax.set_mesh`'s or the input's, if either is it; else None."""
  if isinstance(mesh, Mesh):
    return mesh
  for candidate in (placement_mesh(None), _mesh_of(source)):
    if isinstance(candidate, Mesh) and candidate.abstract_mesh == mesh:
      return candidate
  return None


def _train_state(target: TrainState, optimizer, params, filled, conversion: Conversion) -> TrainState:
  """`target` holding the converted collections, optimizer state and step."""
  options = conversion.options
  mesh_hint = options.mesh or mesh_of_tree(params)
  produced, step = optimizer_state.nnx_opt_to_linen(optimizer, params, conversion)
  opt_template, treedef = linen_trees.opt_state_template(target)
  opt_filled = fill(
      'nnx -> linen opt_state', opt_template, produced, options=options, mesh=mesh_hint,
      prefix='opt_state/',
  )
  step = scalar_like(step, getattr(target.step, 'dtype', np.dtype('int32')), mesh_hint, 'step')
  conversion.protect([step, *_scalars(produced, opt_filled)])
  conversion.run()
  return target.replace(
      step=step, opt_state=linen_trees.write_opt_state(opt_filled, treedef, conversion.value),
      **linen_trees.write_collections(filled, conversion.value),
  )


def _scalars(*leaves: Mapping) -> list:
  """The scalars (no annotation) of optimizer state, as read and as converted:
  arrays outside the planned trees, which donation must never delete."""
  return [value for tree in leaves for value, annotation in tree.values() if annotation is None]


def _nonempty_collections(converted: Mapping[str, dict]) -> dict[str, dict]:
  """Without a target, a collection that converts to nothing is left out."""
  return {c: flat for c, flat in converted.items() if flat}


def _nonempty(flat: dict, where: str) -> dict:
  if not flat:
    raise StructureError(
        f'{where}: holds no parameters; pass the model\'s parameters (an empty '
        'tree converts to nothing)',
        [where],
    )
  return flat
