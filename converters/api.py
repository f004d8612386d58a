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

Which Variable type each collection has is in `converters.variable_types`;
how optimizer states correspond, in `converters.optimizer_state`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import Mesh

from converters import metadata as md
from converters import paths as path_mapping
from converters.errors import (
    AnnotationError,
    LeafErrors,
    PathMappingError,
    StructureError,
    format_offenders,
)
from converters.inference import infer_models
from converters.linen_model import LinenModel, accepts_layout
from converters.optimizer_state import linen_opt_to_nnx, nnx_opt_to_linen
from converters.paths import PathMapping, as_infer, format_path
from converters.tree_io import (
    Batch,
    Options,
    check_against_template,
    check_keys,
    in_target_form,
    keys_of,
    mesh_of_tree,
    nest,
    read_linen_tree,
    read_nnx_state,
    scalar_like,
)
from converters.variable_types import CollectionTable

#: The fields every `TrainState` has; the others of a subclass are collections.
_TRAIN_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainState))


def _extra_fields(state: TrainState):
  """`(name, value)` of a `TrainState` subclass's own pytree fields."""
  for field in dataclasses.fields(state):
    if field.name not in _TRAIN_STATE_FIELDS and field.metadata.get('pytree_node', True):
      yield field.name, getattr(state, field.name)


def linen_collections(linen, table: CollectionTable) -> dict[str, Any]:
  """`{collection: tree}` of a variables dict or a `TrainState` (its extra fields)."""
  if isinstance(linen, TrainState):
    trees = {'params': linen.params}
    for name, tree in _extra_fields(linen):
      if tree is None:
        continue
      if name not in table.by_name:
        raise StructureError(
            f'TrainState.{name}: is not a collection, and NNX has no place for '
            f'it; leave it out (state.replace({name}=None)) and keep it aside, or, '
            f'if it holds variables, pass collections={{{name!r}: VariableType}}',
            [f'TrainState.{name}'],
        )
      trees[name] = tree
    return _collection_trees(trees, 'TrainState.')
  if not isinstance(linen, Mapping) or not linen:
    raise StructureError(
        'linen input must be a TrainState or a variables dict of collections '
        f"({{'params': ..., 'batch_stats': ...}}), got {type(linen).__name__}"
        + (' (empty)' if isinstance(linen, Mapping) else '')
    )
  for name in linen:
    table.variable_type(name, str(name))
  return _collection_trees(dict(linen), '')


def _collection_trees(trees: dict, prefix: str) -> dict:
  """Every collection is a dict of variables (a bare leaf would have no path)."""
  bare = [f'{prefix}{name}' for name, tree in trees.items() if not isinstance(tree, Mapping)]
  if bare:
    raise StructureError(
        f'{format_offenders(bare)}: a collection is a dict of variables by path, '
        f'not a {type(trees[bare[0][len(prefix):]]).__name__}',
        bare,
    )
  return trees


def _mapping(paths, linen_model, nnx_model, nnx_default, *, mesh, rules, collections, both_layouts=False):
  """`paths` as the conversions take it: 'infer' (or `Infer(known)`)
  replaced by the mapping inferred from the two models
  (`converters.inference.infer_models`), the known rules first."""
  infer = as_infer(paths)
  if infer is None:
    if isinstance(paths, str):
      raise PathMappingError(
          f"paths={paths!r}: give a PathMapping (or PathRules), None to keep every "
          "path, or 'infer' (Infer(known_rules)) to derive the mapping from the two models"
      )
    given = [name for name, m in (('linen_model', linen_model), ('nnx_model', nnx_model)) if m is not None]
    if given:
      raise PathMappingError(
          f"{' and '.join(given)} given with paths={paths!r}: the models are read "
          "only to infer the mapping; pass paths='infer', or leave them out"
      )
    return paths
  nnx_model = nnx_model if nnx_model is not None else nnx_default
  missing = [
      fix for model, fix in (
          (linen_model, 'linen_model=LinenModel(module, *example_inputs) (or a function returning one)'),
          (nnx_model, 'nnx_model= (the NNX model, or a function returning it)'),
      ) if model is None
  ]
  if missing:
    raise PathMappingError(
        "paths='infer' derives the mapping from what the Linen model and its "
        f"port compute; pass {' and '.join(missing)}"
    )
  if both_layouts and not (accepts_layout(linen_model) and accepts_layout(nnx_model)):
    raise PathMappingError(
        "relayout with paths='infer' needs both layouts of both models: give "
        "linen_model and nnx_model as functions with a layout parameter ('loop' "
        "or 'scan'), or infer_paths(...) of each layout joined by "
        'converters.inference.merge_layouts as paths='
    )
  return infer_models(
      linen_model, nnx_model, paths=infer.known, mesh=mesh, rules=rules, collections=collections
  )


def _plan_collections(
    trees: Mapping[str, Any], source: str, target: str, batch: Batch, read
) -> tuple[dict[str, dict], dict[tuple, tuple[Any, md.Annotation, str]]]:
  """Reads and plans every collection; `(flat per collection, {target path: (value, annotation, collection)})`.

  Target paths of different collections share one NNX namespace, so they
  must not collide.
  """
  flats, planned, owner = {}, {}, {}
  collided = []
  for name, tree in trees.items():
    flats[name] = read(name, tree)
  # One mapping for every collection (and the optimizer state planned after them).
  batch.options = dataclasses.replace(batch.options, paths=path_mapping.resolve(batch.options.paths))
  for name in trees:
    for path, (value, annotation) in batch.plan(flats[name], source, target).items():
      if path in owner:
        collided.append(f'{format_path(path)} ({owner[path]} and {name})')
      owner[path] = name
      planned[path] = (value, annotation, name)
  if collided:
    raise StructureError(
        f'variables of different collections map to one path: {format_offenders(collided)}; '
        'map them to distinct paths (paths=...)',
        collided,
    )
  return flats, planned


def linen_to_nnx(
    linen: Mapping | TrainState,
    *,
    target: Any = None,
    paths: PathMapping | str | None = None,
    scan: bool | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
    donate: bool = False,
    strict: bool = False,
    collections: Mapping[str, type] | None = None,
    rngs: int | Mapping[str, Any] | None = None,
    linen_model: LinenModel | Callable[..., LinenModel] | None = None,
    nnx_model: nnx.Module | Callable[..., nnx.Module] | None = None,
):
  """Converts Linen variables or a `TrainState` to NNX.

  Args:
    linen: a variables dict of collections, boxed or bare (`{'params': ...,
      'batch_stats': ..., 'cache': ...}`), or a `TrainState` (a subclass's
      extra fields, such as `batch_stats`, are collections).
    target: NNX structure to fill: a model, or `(model, optimizer)` (needed for
      a `TrainState`); real or abstract (`nnx.eval_shape`). Not modified. Its
      RNG state (`nnx.Rngs` streams) is kept as it is: Linen has none.
    paths: the Linen <-> NNX path mapping: a `PathMapping` or any iterable
      of `PathRule`s; None keeps every parameter's path
      (`PathMapping.identity()`); `'infer'` derives it from what the two
      models compute (`linen_model`, `nnx_model`; `converters.infer_paths`),
      `Infer(known_rules)` likewise with the rules you know taking precedence.
      It maps the paths of every collection.
    scan: target layout of layer variables (True stacked, False looped,
      None as the source).
    layer_partition: layer axis name inserted when stacking.
    num_layers: expected number of layers, checked in every layout
      (inferred when None).
    mesh: the mesh of arrays that carry no `NamedSharding` (abstract trees).
    rules: logical rules for logical annotations that carry none; attached to
      the output (as `sharding_rules` / the box's rules) so it resolves alone.
      Without it, the rules of an enclosing `nn.logical_axis_rules(...)`
      resolve them (and are not attached: the output resolves as the input).
    donate: delete each input array that is relaid (stacked or sliced) as
      soon as its replacement exists, so a relayout holds one group of layers
      twice instead of the whole tree. The input must not be used afterwards.
      Every check runs before any array is deleted; only a failure while the
      arrays are being built (out of memory) can leave some deleted. Arrays
      whose layout does not change are never deleted (they are the output's),
      nor is any buffer that two input leaves share (tied weights).
    strict: refuse a collection whose leaves are partly boxed; by default a
      bare leaf beside boxed ones is replicated, as Linen's
      `get_partition_spec` reads it.
    collections: `{collection name: nnx.Variable subclass}` for collections
      beyond `params`, `batch_stats` and `cache`.
    rngs: seeds for the target's RNG streams (`nnx.reseed`, each stream's key
      split to its shape): an int for every stream, or `{stream: seed or
      key}`. Needed when the target's RNG state is abstract (a target from
      `nnx.eval_shape`), which Linen has nothing to fill with; without it a
      real target's RNG state is kept as it is.
    linen_model: with `paths='infer'`, the Linen model the variables are
      of: `LinenModel(module, *example_inputs)`, or a function returning one.
    nnx_model: with `paths='infer'`, the NNX port (default: the target's
      model), or a function returning it. Functions with a `layout`
      parameter (`'loop'`/`'scan'`) on both sides give the mapping of both
      layouts, for conversions to either layout; models of one layout each
      map in their own (a Linen model that scans, a port that loops).

  Every placed input array must sit where its annotation says, and a
  target's arrays must live on the input's mesh: the conversion checks, it
  never reshards.

  Returns:
    Without `target`: an `nnx.State` (for `nnx.update`).
    With a model target: a new model; with `(model, optimizer)`: a new pair.
    Arrays whose layout does not change are the input arrays (no copy).

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  target_model = target[0] if isinstance(target, tuple) and target else target
  paths = _mapping(
      paths, linen_model, nnx_model,
      target_model if isinstance(target_model, nnx.Module) else None,
      mesh=mesh, rules=rules, collections=collections,
  )
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules, donate, strict)
  table = CollectionTable(collections)
  is_state = isinstance(linen, TrainState)
  trees = linen_collections(linen, table)
  if is_state and (not isinstance(target, tuple) or len(target) != 2):
    raise StructureError(
        'converting a TrainState needs target=(model, optimizer): the NNX '
        'optimizer whose state structure to fill (real, or from nnx.eval_shape)'
    )
  if not is_state and isinstance(target, tuple):
    raise StructureError(
        'target has an optimizer but the Linen input has no opt_state; pass a '
        'TrainState, or a model alone as target'
    )
  model, optimizer = target if is_state else (target, None)
  if target is not None and not isinstance(model, nnx.Module):
    raise StructureError(
        f'target model is a {type(model).__name__}; pass an nnx.Module (real, or '
        'from nnx.eval_shape)'
    )
  batch = Batch(options)
  read = lambda name, tree: read_linen_tree(tree, name, strict=options.strict)
  try:
    flats, converted = _plan_collections(
        {name: tree for name, tree in trees.items()}, 'linen', 'nnx', batch,
        lambda name, tree: _nonempty(read(name, tree), name) if name == 'params' else read(name, tree),
    )
  except PathMappingError as e:
    if model is None:
      raise
    variables = nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngState)))
    raise _with_target_side(e, batch.options.paths, 'nnx', [p for p, _ in variables]) from None
  if target is None:
    batch.run()
    return nnx.State(nest({
        p: md.write_nnx(table.by_name[c], batch.value(v), a) for p, (v, a, c) in converted.items()
    }))

  objects = {'model': model} if optimizer is None else {'model': model, 'optimizer': optimizer}
  graphdef, template = nnx.split(objects)
  template_flat = read_nnx_state(template, 'target', options.resolution_rules)
  kept_rngs = _rng_state(template_flat, rngs)
  produced = {('model',) + p: (v, a) for p, (v, a, _) in converted.items()}
  if optimizer is not None:
    produced.update(linen_opt_to_nnx(linen, flats.get('params', {}), optimizer, batch))
  mapping = batch.options.paths
  check_keys(
      'linen -> nnx', [p for p in template_flat if p not in kept_rngs], produced,
      explain=lambda p, _: mapping.describe('nnx', p[1:]) if p[0] == 'model' else None,
  )

  # Every check passes before any array is built (or any donated one deleted).
  scalars, written = {}, {}
  errors = LeafErrors()
  for path, (t_value, t_annotation, t_var) in template_flat.items():
    if path in kept_rngs:
      continue
    value, annotation = produced[path]
    where = format_path(path)
    with errors.leaf():
      if annotation is None:  # a step or count: the target's own metadata
        mesh = options.mesh or mesh_of_tree(template_flat)
        scalars[path] = scalar_like(value, t_value.dtype, mesh, where)
        continue
      if path[0] == 'model':
        _check_collection(where, converted[path[1:]][2], t_var, table)
      check_against_template(
          where, value, annotation, t_value, t_annotation, options.resolution_rules
      )
      _check_fills(where, t_var, t_value, annotation)
      written[path] = annotation
  errors.raise_any()
  batch.protect(value for value, annotation in produced.values() if annotation is None)
  batch.run()

  new_flat = {}
  for path, (_, _, t_var) in template_flat.items():
    if path in kept_rngs:  # a Variable of its own: the target is never modified
      new_flat[path] = t_var.replace(t_var.get_raw_value())
    elif path in scalars:
      new_flat[path] = t_var.replace(scalars[path])
    else:
      new_var = t_var.replace(batch.value(produced[path][0]))
      for key, extra in written[path].extra:
        new_var.set_metadata(key, extra)
      new_flat[path] = new_var
  objects = nnx.merge(graphdef, nnx.State(nest(new_flat)))
  if rngs is not None and kept_rngs:
    nnx.reseed(objects['model'], policy='match_shape', **_stream_seeds(template_flat, kept_rngs, rngs))
  return (objects['model'], objects['optimizer']) if optimizer is not None else objects['model']


def _rng_state(template_flat, rngs) -> set[tuple]:
  """The target's RNG state, kept as it is or reseeded; refused when abstract and not reseeded."""
  found = {p for p, (_, _, var) in template_flat.items() if isinstance(var, nnx.RngState)}
  abstract = [format_path(p) for p in found if isinstance(template_flat[p][0], jax.ShapeDtypeStruct)]
  if abstract and rngs is None:
    raise StructureError(
        f'the target\'s RNG state is abstract: {format_offenders(abstract)}; Linen has '
        'no RNG state to fill it with. Pass rngs=<seed> (or {stream: seed}) to seed '
        'its streams, build the target for real, or convert without target and '
        'nnx.update(model, state)',
        abstract,
    )
  return found


def _stream_seeds(template_flat, rng_paths, rngs) -> dict[str, Any]:
  """`{stream: seed}` for every stream of the target, from `rngs=`."""
  streams = sorted({
      template_flat[p][2].tag for p in rng_paths if isinstance(template_flat[p][2], nnx.RngKey)
  })
  if isinstance(rngs, Mapping):
    missing = [s for s in streams if s not in rngs]
    unknown = sorted(set(rngs) - set(streams))
    if missing or unknown:
      raise StructureError(
          f'rngs={dict(rngs)!r}: the target\'s RNG streams are {streams}; give a seed '
          f'for each (missing {missing}, unknown {unknown}), or one int for all',
          missing + unknown,
      )
    return {s: rngs[s] for s in streams}
  if isinstance(rngs, bool) or not isinstance(rngs, (int, np.integer)):
    raise StructureError(f'rngs={rngs!r}: pass an int seed, or a dict of stream -> seed')
  return {s: int(rngs) for s in streams}


def _check_collection(where: str, collection: str, t_var: nnx.Variable, table: CollectionTable) -> None:
  wanted = table.by_name[collection]
  if table.collection(t_var, where) != collection:
    raise StructureError(
        f'{where}: converted from the Linen {collection!r} collection '
        f'({wanted.__name__} Variables), but the target holds a {type(t_var).__name__} there; '
        'map the path to a Variable of the same kind, or pass collections=... '
        'to say which type the collection has',
        [where],
    )


def _check_fills(where: str, t_var: nnx.Variable, t_value, annotation: md.Annotation) -> None:
  """The target Variable takes the annotation's extra metadata."""
  try:
    probe = t_var.replace(jax.ShapeDtypeStruct(t_value.shape, t_value.dtype))
    for key, extra in annotation.extra:
      probe.set_metadata(key, extra)
  except (ValueError, TypeError, AttributeError) as e:
    raise AnnotationError(
        f'{where}: the target Variable refuses the metadata '
        f'{dict(annotation.extra)}: {e}; drop or rename those metadata keys',
        [where],
    ) from e


def _nonempty(flat: dict, where: str) -> dict:
  if not flat:
    raise StructureError(
        f'{where}: holds no parameters; pass the model\'s parameters (an empty '
        'tree converts to nothing)',
        [where],
    )
  return flat


def _nnx_collections(state, table: CollectionTable, rules, where: str) -> dict[str, dict]:
  """`{collection: flat}` of an `nnx.State`; RNG state left out (Linen has none)."""
  for path, var in nnx.to_flat_state(state):  # what is refused by kind, before by value
    if isinstance(var, nnx.Variable):
      table.collection(var, f'{where}/{format_path(path)}')
  groups: dict[str, dict] = {}
  for path, (value, annotation, var) in read_nnx_state(state, where, rules).items():
    collection = table.collection(var, f'{where}/{format_path(path)}')
    if collection is not None:
      groups.setdefault(collection, {})[path] = (value, annotation, var)
  return groups


def _with_target_side(
    error: PathMappingError, mapping: PathMapping | None, framework: str, target_paths
) -> PathMappingError:
  """`error` (source paths no rule maps) with the target's `framework` paths
  that no rule maps either, so that both sides of a missing rule are named."""
  if mapping is None:
    return error
  unmapped = [format_path(p) for p in target_paths if not mapping.match_all(framework, p)]
  if not unmapped:
    return error
  return PathMappingError(
      f'{error.problem}; and no rule maps these {framework} paths of the target: '
      f'{format_offenders(unmapped)}',
      error.paths + tuple(unmapped),
      fix=error.fix,
  )


def nnx_to_linen(
    nnx_in,
    *,
    target: TrainState | None = None,
    paths: PathMapping | str | None = None,
    scan: bool | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
    donate: bool = False,
    strict: bool = False,
    collections: Mapping[str, type] | None = None,
    linen_model: LinenModel | Callable[..., LinenModel] | None = None,
    nnx_model: nnx.Module | Callable[..., nnx.Module] | None = None,
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
    paths, scan, layer_partition, num_layers, mesh, rules, donate, strict,
      collections: as in `linen_to_nnx`.
    linen_model, nnx_model: with `paths='infer'`, as in `linen_to_nnx`;
      `nnx_model` defaults to the input's model (needed for an `nnx.State`).

  Returns:
    Without an optimizer: `{collection: boxed tree}` (`{'params': ...}` for
    a model of parameters only), in the target's annotation form if given.
    With one: a new `TrainState`. Arrays whose
    layout does not change are the input arrays.

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  source_model = nnx_in[0] if isinstance(nnx_in, tuple) and nnx_in else nnx_in
  paths = _mapping(
      paths, linen_model, nnx_model,
      source_model if isinstance(source_model, nnx.Module) else None,
      mesh=mesh, rules=rules, collections=collections,
  )
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules, donate, strict)
  table = CollectionTable(collections)
  optimizer = None
  if isinstance(nnx_in, tuple):
    if len(nnx_in) != 2 or not isinstance(nnx_in[0], nnx.Module) or nnx_in[1] is None:
      raise StructureError(
          'pass an nnx.State, a model, or (model, optimizer) with both present, got '
          f'({", ".join(type(x).__name__ for x in nnx_in)})'
      )
    model, optimizer = nnx_in
    state = nnx.state(model)
  elif isinstance(nnx_in, nnx.Module):
    state = nnx.state(nnx_in)
  elif isinstance(nnx_in, nnx.State):
    state = nnx_in
  else:
    raise StructureError(
        f'nnx input must be an nnx.State, a model or (model, optimizer), got '
        f'{type(nnx_in).__name__}'
    )
  if optimizer is None and isinstance(target, TrainState):
    raise StructureError('a TrainState target needs (model, optimizer) as input')
  if optimizer is None and target is not None and not isinstance(target, Mapping):
    raise StructureError(
        f'target is a {type(target).__name__}; pass Linen variables ({{collection: '
        'tree}}, real or from jax.eval_shape of your init) to take their annotations'
    )
  if optimizer is not None and not isinstance(target, TrainState):
    raise StructureError(
        'converting an optimizer needs target=TrainState (real, or from '
        'jax.eval_shape of your init) for its tx and opt_state structure'
    )
  groups = _nnx_collections(state, table, options.resolution_rules, 'model')
  if optimizer is not None or not groups:
    _nonempty(groups.get('params', {}), 'model')
  batch = Batch(options)
  try:
    flats, converted = _plan_collections(
        groups, 'nnx', 'linen', batch, lambda name, flat: flat
    )
  except PathMappingError as e:
    params = target.params if isinstance(target, TrainState) else (target or {}).get('params')
    if params is None:
      raise
    leaves = jax.tree_util.tree_flatten_with_path(params, is_leaf=md.is_linen_box)[0]
    raise _with_target_side(e, batch.options.paths, 'linen', [keys_of(k) for k, _ in leaves]) from None
  if target is None:
    batch.run()
    out: dict[str, dict] = {}
    for p, (v, a, c) in converted.items():
      out.setdefault(c, {})[p] = md.write_linen(batch.value(v), a)
    return {c: nest(flat) for c, flat in out.items()}

  written = _fill_linen_templates(_linen_templates(target, table, groups), converted, batch.options)
  if optimizer is None:
    batch.run()
    return {
        c: nest({p: md.write_linen(batch.value(v), a) for p, (v, a) in flat.items()})
        for c, flat in written.items()
    }
  mesh_hint = options.mesh or mesh_of_tree(flats['params'])
  # Checks the optimizer state against the target, then builds every array.
  step, opt_state = nnx_opt_to_linen(optimizer, flats['params'], target, batch, mesh_hint)
  trees = {
      c: nest({p: md.write_linen(batch.value(v), a) for p, (v, a) in flat.items()})
      for c, flat in written.items()
  }
  return target.replace(step=step, opt_state=opt_state, **trees)


def _linen_templates(target, table: CollectionTable, groups) -> dict[str, Any]:
  """`{collection: template tree}` of a Linen target: a variables dict, or a
  `TrainState` whose fields of collection names (`params`, `batch_stats`) are the collections."""
  if isinstance(target, TrainState):
    templates = {'params': target.params}
    for name, tree in _extra_fields(target):
      if name in table.by_name:
        if tree is not None or name in groups:
          templates[name] = tree
        continue
      # Not a collection: kept from the target, as `tx` and `apply_fn` are.
      abstract = [
          jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
          if isinstance(x, jax.ShapeDtypeStruct)
      ]
      if abstract:
        raise StructureError(
            f'target.{name}: is not a collection, so the output keeps the '
            f"target's, but it is abstract ({format_offenders(abstract)}); give the "
            'target a real value for it',
            [f'target.{name}'],
        )
    kind = 'the TrainState target has no field for'
    fix = (
        'use a TrainState subclass with a field of that name ({0}: Any), as '
        "Flax's ImageNet example does"
    )
  else:
    templates = dict(target)
    for name in templates:
      table.variable_type(name, f'target/{name}')
    kind = 'the target variables have no collection'
    fix = 'give the target that collection ({0}), or convert a model without it'
  lacking = sorted(set(groups) - set(templates))
  if lacking:
    raise StructureError(
        f'the NNX model has {lacking} but {kind} '
        f'{"them" if len(lacking) > 1 else "it"}; ' + fix.format(lacking[0]),
        lacking,
    )
  return templates


def _fill_linen_templates(templates, converted, options: Options) -> dict[str, dict]:
  """Checks the converted leaves against the templates; what to write, in the target's form."""
  written: dict[str, dict] = {collection: {} for collection in templates}
  for collection in sorted(templates):
    template = read_linen_tree(templates[collection], f'target.{collection}')
    mine = {p: (v, a) for p, (v, a, c) in converted.items() if c == collection}
    check_keys(
        f'nnx -> linen {collection}', template, mine,
        explain=lambda p, _: options.paths.describe('linen', p) if options.paths else None,
    )
    errors = LeafErrors()
    for p, (value, annotation) in mine.items():
      t_value, t_annotation = template[p]
      where = f'{collection}/{format_path(p)}'
      with errors.leaf():
        check_against_template(
            where, value, annotation, t_value, t_annotation, options.resolution_rules
        )
        form = md.with_default_rules(in_target_form(annotation, t_annotation), options.rules)
        written[collection][p] = (value, form)
    errors.raise_any()
  return written


def relayout(
    tree,
    *,
    scan: bool,
    paths: PathMapping | str | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
    donate: bool = False,
    strict: bool = False,
    collections: Mapping[str, type] | None = None,
    linen_model: Callable[..., LinenModel] | None = None,
    nnx_model: Callable[..., nnx.Module] | None = None,
):
  """Scanned <-> looped within one framework, for variables.

  Args:
    tree: Linen variables `{collection: boxed tree}` or an `nnx.State`
      (without RNG state: split it off with `nnx.state(model, nnx.Not(nnx.RngState))`).
    scan: True to stack the layers, False to unstack them.
    paths, layer_partition, num_layers, mesh, rules, donate, strict,
      collections: as in `linen_to_nnx`.
    linen_model, nnx_model: with `paths='infer'`, functions with a `layout`
      parameter (`'loop'`/`'scan'`) making the Linen model (a `LinenModel`)
      and its NNX port: the mapping of both layouts is inferred from them.

  Returns:
    The same kind of tree in the other layout. For a whole training state,
    convert through the other framework with targets in the wanted layout.
  """
  paths = _mapping(
      paths, linen_model, nnx_model, None,
      mesh=mesh, rules=rules, collections=collections, both_layouts=True,
  )
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules, donate, strict)
  table = CollectionTable(collections)
  batch = Batch(options)
  if isinstance(tree, nnx.State):
    flat = read_nnx_state(tree, 'model', options.resolution_rules)
    rngs = [format_path(p) for p, (_, _, var) in flat.items() if isinstance(var, nnx.RngState)]
    if rngs:
      raise StructureError(
          f'relayout of RNG state is not defined: {format_offenders(rngs)}; split it '
          'off first (nnx.state(model, nnx.Not(nnx.RngState)))',
          rngs,
      )
    _nonempty(flat, 'model')
    kinds: dict[str, type] = {}
    groups: dict[str, dict] = {}
    for p, entry in flat.items():
      var = entry[2]
      table.collection(var, f'model/{format_path(p)}')
      kind = type(var)
      kinds[f'{kind.__module__}.{kind.__qualname__}'] = kind
      groups.setdefault(f'{kind.__module__}.{kind.__qualname__}', {})[p] = entry
    _, planned = _plan_collections(groups, 'nnx', 'nnx', batch, lambda name, group: group)
    batch.run()
    return nnx.State(nest({
        p: md.write_nnx(kinds[k], batch.value(v), a) for p, (v, a, k) in planned.items()
    }))
  if isinstance(tree, Mapping) and not isinstance(tree, nnx.State):
    trees = linen_collections(tree, table)
    _, converted = _plan_collections(
        trees, 'linen', 'linen', batch,
        lambda name, t: read_linen_tree(t, name, strict=options.strict),
    )
    batch.run()
    out: dict[str, dict] = {}
    for p, (v, a, c) in converted.items():
      out.setdefault(c, {})[p] = md.write_linen(batch.value(v), a)
    return {c: nest(flat) for c, flat in out.items()}
  raise StructureError(
      "relayout takes Linen variables ({'params': ...}) or an nnx.State, got "
      f'{type(tree).__name__}'
  )
