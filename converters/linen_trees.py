"""Linen's trees: read into flat maps, and written back.

A Linen input is a variables dict of collections (`{'params': ...,
'batch_stats': ...}`, boxed or bare) or a `TrainState`, whose extra fields
(`batch_stats`) are collections too (`input_collections`). `read_collection` turns one
collection into `{path: (array, Annotation)}`; `templates_of` and
`opt_state_template` read what a Linen target holds; `write_collections` and
`write_opt_state` build the boxed trees back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax.training.train_state import TrainState

from converters import metadata as md
from converters.errors import AnnotationError, OptimizerStateError, StructureError, format_offenders
from converters.flat_trees import check_array, keys_of, nest, never
from converters.paths import format_path
from converters.variable_types import CollectionTable

#: The fields every `TrainState` has; the others of a subclass are collections.
TRAIN_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainState))


def _extra_fields(state: TrainState):
  """`(name, value)` of a `TrainState` subclass's own pytree fields."""
  for field in dataclasses.fields(state):
    if field.name not in TRAIN_STATE_FIELDS and field.metadata.get('pytree_node', True):
      yield field.name, getattr(state, field.name)


def only_linen_state(tree, only: Callable[[tuple], bool]) -> bool:
  """Whether every leaf of a collection is state only Linen has (`only`: a
  one-sided rule names it), so that NNX needs no Variable type for it."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=md.is_linen_box)[0]
  return bool(leaves) and all(only(keys_of(k)) for k, _ in leaves)


def input_collections(
    linen, table: CollectionTable, *, only: Callable[[tuple], bool] = never
) -> dict[str, Any]:
  """`{collection: tree}` of a variables dict or a `TrainState` (its extra
  fields). A collection of state only Linen has (`only`) needs no NNX type."""
  if isinstance(linen, TrainState):
    trees = {'params': linen.params}
    for name, tree in _extra_fields(linen):
      if tree is None:
        continue
      if name not in table.by_name and only_linen_state(tree, only):
        trees[name] = tree
      elif name not in table.by_name:
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
  trees = _collection_trees(dict(linen), '')
  for name, tree in trees.items():
    if not only_linen_state(tree, only):
      table.variable_type(name, str(name))
  return trees


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


def read_collection(
    tree, where: str, *, strict: bool = False
) -> dict[tuple, tuple[Any, md.Annotation]]:
  """`{path: (array, annotation)}` of a Linen tree, boxed or bare.

  A bare leaf is replicated, as Linen's `get_partition_spec` reads it; with
  `strict`, a tree whose leaves are partly boxed is rejected instead. `None`
  leaves and leaves that are not arrays are rejected, never dropped.
  """
  is_leaf = lambda x: x is None or md.is_linen_box(x)
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]
  flat = {}
  for keypath, leaf in leaves:
    path = keys_of(keypath)
    flat[path] = md.read_linen(leaf, f'{where}/{format_path(path)}')
    check_array(flat[path][0], f'{where}/{format_path(path)}')
  boxed = [p for p, (_, a) in flat.items() if a.names is not None]
  unboxed = [format_path(p) for p, (_, a) in flat.items() if a.names is None]
  if strict and boxed and unboxed:
    raise AnnotationError(
        f'{where}: some parameters are boxed (e.g. {format_path(boxed[0])}) but '
        f'these are bare arrays: {format_offenders(unboxed)}; annotate them too '
        '(nn.with_partitioning(init, (None,) * ndim)), or convert with '
        'strict=False to read them as replicated',
        unboxed,
    )
  return flat


def templates_of(
    target, table: CollectionTable, groups, *, only: Callable[[tuple], bool] = never
) -> dict[str, Any]:
  """`{collection: template tree}` of a Linen target: a variables dict, or a
  `TrainState` whose fields of collection names (`params`, `batch_stats`) are
  the collections; a collection of state only Linen has (`only`) is one too."""
  if isinstance(target, TrainState):
    templates = {'params': target.params}
    for name, tree in _extra_fields(target):
      if name not in table.by_name and only_linen_state(tree, only):
        templates[name] = tree
        continue
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
    for name, tree in templates.items():
      if not only_linen_state(tree, only):
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


def check_untrained(params, only: Callable[[tuple], bool], where: str) -> None:
  """Refuses parameters of a `TrainState` that are state only Linen has
  (`only`): the optimizer trains them, and their optimizer state would have
  no NNX counterpart either."""
  trained = [f'{where}/{format_path(p)}' for p in tree_param_paths(params) if only(p)]
  if trained:
    raise StructureError(
        f'{format_offenders(trained)}: named by a one-sided rule (state only Linen has), '
        'but a parameter the optimizer trains: its optimizer state has no NNX counterpart '
        'to convert',
        trained,
        fix='keep a constant the model computes once out of params (a collection of its '
        'own), or give it an NNX counterpart and a two-sided rule',
    )


def kept_from_target(
    template: Mapping[tuple, tuple[Any, md.Annotation]], only: Callable[[tuple], bool], collection: str
) -> dict[tuple, tuple[Any, md.Annotation]]:
  """The leaves of a target collection that are state only Linen has (`only`:
  a one-sided rule names them), kept as the target holds them; refused where
  the target is abstract, as NNX has nothing to fill them with."""
  kept = {p: leaf for p, leaf in template.items() if only(p)}
  abstract = [
      f'{collection}/{format_path(p)}' for p, (v, _) in kept.items() if isinstance(v, jax.ShapeDtypeStruct)
  ]
  if abstract:
    raise StructureError(
        f'the target is abstract where it holds state only Linen has: {format_offenders(abstract)}; '
        "a one-sided rule keeps the target's value there, and NNX has none to give",
        abstract,
        fix='give a target of real values there (from your init), or convert without target',
    )
  return kept


def _boxed_leaves(tree) -> tuple[list[tuple[tuple, Any]], Any]:
  """`([(path, leaf)], treedef)` of a Linen tree, boxes as leaves."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=md.is_linen_box)
  return [(keys_of(k), leaf) for k, leaf in leaves], treedef


def opt_state_template(target: TrainState) -> tuple[dict[tuple, tuple[Any, Any]], Any]:
  """`({path: (value, annotation)}, treedef)` of a `TrainState` target's optax state."""
  leaves, treedef = _boxed_leaves(target.opt_state)
  template = {p: md.read_linen(leaf, 'target.opt_state/' + format_path(p)) for p, leaf in leaves}
  if len(template) != len(leaves):
    raise OptimizerStateError('target.opt_state: two leaves share one path; pass a real optax state')
  return template, treedef


def variable_shapes(target) -> dict[tuple, tuple]:
  """`{path: shape}` of every variable of a Linen target (variables, or a
  `TrainState`'s parameters and collection fields), collections merged:
  what binds a path mapping to the target model."""
  if isinstance(target, TrainState):
    trees = [target.params, *(tree for _, tree in _extra_fields(target) if isinstance(tree, Mapping))]
  else:
    trees = [tree for tree in (target or {}).values() if isinstance(tree, Mapping)]
  return {p: tuple(getattr(leaf.value if md.is_linen_box(leaf) else leaf, 'shape', ()))
          for tree in trees for p, leaf in _boxed_leaves(tree)[0]}


def tree_param_paths(tree) -> list[tuple]:
  """The paths of a Linen tree's parameters (boxes are leaves)."""
  return [p for p, _ in _boxed_leaves(tree)[0]]


def write_collections(
    collections: Mapping[str, Mapping[tuple, tuple[Any, md.Annotation]]], value_of: Callable[[Any], Any]
) -> dict[str, dict]:
  """`{collection: boxed tree}`; `value_of` gives the array a planned value stands for."""
  return {
      c: nest({p: md.write_linen(value_of(v), a) for p, (v, a) in flat.items()})
      for c, flat in collections.items()
  }


def write_opt_state(filled: Mapping[tuple, tuple[Any, Any]], treedef, value_of: Callable[[Any], Any]):
  """The optax state of `treedef`, from `fill`'s leaves (in the template's order)."""
  leaves = [
      value if annotation is None else md.write_linen(value_of(value), annotation)
      for value, annotation in filled.values()
  ]
  return jax.tree.unflatten(treedef, leaves)


def check_target(target, *, has_optimizer: bool) -> None:
  """A Linen target fits the NNX input: a `TrainState` with an optimizer, variables without."""
  if not has_optimizer and isinstance(target, TrainState):
    raise StructureError('a TrainState target needs (model, optimizer) as input')
  if not has_optimizer and target is not None and not isinstance(target, Mapping):
    raise StructureError(
        f'target is a {type(target).__name__}; pass Linen variables ({{collection: '
        'tree}}, real or from jax.eval_shape of your init) to take their annotations'
    )
  if has_optimizer and not isinstance(target, TrainState):
    raise StructureError(
        'converting an optimizer needs target=TrainState (real, or from '
        'jax.eval_shape of your init) for its tx and opt_state structure'
    )


def target_params(target) -> Any:
  """The `params` tree of a Linen target (a `TrainState` or variables), or None."""
  if isinstance(target, TrainState):
    return target.params
  return (target or {}).get('params')
