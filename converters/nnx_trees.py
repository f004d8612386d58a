"""NNX's trees: read into flat maps, and written back.

An NNX input is an `nnx.State`, a model, or a `(model, optimizer)` pair
(`split_input`); `read_state` turns a state into `{path: (array, Annotation,
Variable)}` and `state_collections` groups it by the Linen collection of each
Variable's type. A target model (and optimizer) is read as a `Template`,
which keeps the target's RNG state as it is or reseeds it (Linen has none)
and merges the filled leaves into a new model, never modifying the target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from converters import metadata as md
from converters.errors import AnnotationError, StructureError, format_offenders
from converters.flat_trees import check_array, nest, never
from converters.abstract_models import PLAIN_ARRAY_FIX, without_tracers
from converters.paths import format_path
from converters.variable_types import CollectionTable


#: Whether a model path is state only NNX has (a one-sided `PathRule` names it).
OnlyNNX = Callable[[tuple], bool]


def read_state(
    state, where: str, rules: tuple | None = None, *, only: OnlyNNX = never
) -> dict[tuple, tuple[Any, md.Annotation, nnx.Variable]]:
  """`{path: (array, annotation, variable)}` of an `nnx.State`.

  Names of Variables without `sharding_rules` are read as NNX reads them
  under `rules` (the conversion's, or the context's): see `md.as_logical`.
  Paths of state only NNX has (`only`) are left out, whatever they hold.
  """
  flat = {}
  for path, variable in nnx.to_flat_state(state):
    if only(tuple(path)):
      continue
    where_leaf = f'{where}/{format_path(path)}'
    if not isinstance(variable, nnx.Variable):
      raise StructureError(
          f'{where_leaf}: a plain array attribute ({type(variable).__name__}), not an nnx.Variable',
          [format_path(path)], fix=PLAIN_ARRAY_FIX,
      )
    value, annotation = md.read_nnx(variable, where_leaf)
    check_array(value, where_leaf)
    flat[tuple(path)] = (value, md.as_logical(annotation, rules, where_leaf), variable)
  return flat


def state_collections(
    state, table: CollectionTable, rules, where: str, *, only: OnlyNNX = never
) -> dict[str, dict]:
  """`{collection: flat}` of an `nnx.State`; RNG state and state only NNX has
  (`only`) left out (Linen has none)."""
  for path, var in nnx.to_flat_state(state):  # what is refused by kind, before by value
    if isinstance(var, nnx.Variable) and not only(tuple(path)):
      table.collection(var, f'{where}/{format_path(path)}', tuple(path))
  groups: dict[str, dict] = {}
  for path, (value, annotation, var) in read_state(state, where, rules, only=only).items():
    collection = table.collection(var, f'{where}/{format_path(path)}', tuple(path))
    if collection is not None:
      groups.setdefault(collection, {})[path] = (value, annotation, var)
  return groups


def groups_by_type(
    flat, table: CollectionTable, *, only: OnlyNNX = never
) -> tuple[dict[str, dict], dict[str, type]]:
  """`({type name: flat}, {type name: Variable type})` of a state without RNG
  state, for a relayout within NNX (every Variable keeps its own type; state
  only NNX has, `only`, needs no Linen collection)."""
  rngs = [format_path(p) for p, (_, _, var) in flat.items() if isinstance(var, nnx.RngState)]
  if rngs:
    raise StructureError(
        f'relayout of RNG state is not defined: {format_offenders(rngs)}; split it '
        'off first (nnx.state(model, nnx.Not(nnx.RngState)))',
        rngs,
    )
  kinds: dict[str, type] = {}
  groups: dict[str, dict] = {}
  for p, entry in flat.items():
    var = entry[2]
    if not only(p):
      table.collection(var, f'model/{format_path(p)}', p)
    kind = type(var)
    name = f'{kind.__module__}.{kind.__qualname__}'
    kinds[name] = kind
    groups.setdefault(name, {})[p] = entry
  return groups, kinds


def split_input(nnx_in) -> tuple[Any, Any]:
  """`(state, optimizer or None)` of an `nnx.State`, a model or `(model, optimizer)`."""
  if isinstance(nnx_in, tuple):
    if len(nnx_in) != 2 or not isinstance(nnx_in[0], nnx.Module) or nnx_in[1] is None:
      raise StructureError(
          'pass an nnx.State, a model, or (model, optimizer) with both present, got '
          f'({", ".join(type(x).__name__ for x in nnx_in)})'
      )
    return nnx.state(nnx_in[0]), nnx_in[1]
  if isinstance(nnx_in, nnx.Module):
    return nnx.state(nnx_in), None
  if isinstance(nnx_in, nnx.State):
    return nnx_in, None
  raise StructureError(
      f'nnx input must be an nnx.State, a model or (model, optimizer), got '
      f'{type(nnx_in).__name__}'
  )


def split_target(target, *, train_state: bool) -> tuple[Any, Any]:
  """`(model, optimizer)` of a target for Linen variables, or a `TrainState`'s."""
  if train_state and (not isinstance(target, tuple) or len(target) != 2):
    raise StructureError(
        'converting a TrainState needs target=(model, optimizer): the NNX '
        'optimizer whose state structure to fill (real, or from nnx.eval_shape)'
    )
  if not train_state and isinstance(target, tuple):
    raise StructureError(
        'target has an optimizer but the Linen input has no opt_state; pass a '
        'TrainState, or a model alone as target'
    )
  model, optimizer = target if train_state else (target, None)
  if target is not None and not isinstance(model, nnx.Module):
    raise StructureError(
        f'target model is a {type(model).__name__}; pass an nnx.Module (real, or '
        'from nnx.eval_shape)'
    )
  if model is not None:
    without_tracers(model)  # an abstract target's plain array attributes
  return model, optimizer


def model_param_paths(model) -> list[tuple]:
  """The paths of a model's Variables, RNG state left out."""
  return [p for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngState)))]


def model_variable_shapes(model) -> dict[tuple, tuple]:
  """`{path: shape}` of a model's Variables, RNG state left out."""
  return {p: tuple(getattr(v.get_value() if hasattr(v, 'get_value') else v, 'shape', ()))
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngState)))}


def write_state(
    groups: Mapping[str, Mapping[tuple, tuple[Any, md.Annotation]]],
    types: Mapping[str, type],
    value_of: Callable[[Any], Any],
) -> nnx.State:
  """An `nnx.State` (for `nnx.update`) of every group, each of its Variable type."""
  return nnx.State(nest({
      p: md.write_nnx(types[g], value_of(v), a)
      for g, flat in groups.items() for p, (v, a) in flat.items()
  }))


@dataclasses.dataclass(frozen=True)
class Template:
  """A target model (and optimizer) read for filling; the target itself is never modified.

  Attributes:
    graphdef: of `{'model': model, 'optimizer': optimizer}`.
    variables: `{path: (value, annotation, Variable)}`, paths under `model`/`optimizer`.
    rng_paths: the target's RNG state, kept as it is or reseeded.
    seeds: `{stream: seed}` to reseed it with (`rngs=`), or None to keep it.
    kept: `{path: Variable or array}` of the state only NNX has (`only`),
      and of the model's Variables outside `wrt`: kept as they are.
  """

  graphdef: Any
  variables: Mapping[tuple, tuple[Any, md.Annotation, nnx.Variable]]
  rng_paths: frozenset
  seeds: Mapping[str, Any] | None
  kept: Mapping[tuple, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def of(
      cls, model, optimizer, *, rules: tuple | None, rngs, only: OnlyNNX = never, wrt=None,
  ) -> Template:
    """Reads the target; refuses abstract RNG state that `rngs` does not
    reseed, seeds that are not one per stream, and abstract state only NNX
    has (before anything is built). With `wrt` (an `nnx` filter), only the
    model's Variables it selects are filled; the others are kept as they
    are, abstract ones included (the caller's to fill)."""
    objects = {'model': model} if optimizer is None else {'model': model, 'optimizer': optimizer}
    graphdef, state = nnx.split(objects)
    in_model = lambda p: p[0] == 'model' and only(p[1:])
    kept = {tuple(p): leaf for p, leaf in nnx.to_flat_state(state) if in_model(tuple(p))}
    _check_kept(kept)
    if optimizer is not None:
      check_untrained({p[1:]: v for p, v in kept.items()}, optimizer, 'target/model')
    if wrt is not None:
      selected = nnx.filterlib.to_predicate(wrt)
      kept |= {
          tuple(p): leaf for p, leaf in nnx.to_flat_state(state)
          if p[0] == 'model' and tuple(p) not in kept and not selected(tuple(p[1:]), leaf)
      }
    variables = read_state(state, 'target', rules, only=lambda p: p in kept)
    found = {p for p, (_, _, var) in variables.items() if isinstance(var, nnx.RngState)}
    abstract = [format_path(p) for p in found if isinstance(variables[p][0], jax.ShapeDtypeStruct)]
    if abstract and rngs is None:
      raise StructureError(
          f'the target\'s RNG state is abstract: {format_offenders(abstract)}; Linen has '
          'no RNG state to fill it with. Pass rngs=<seed> (or {stream: seed}) to seed '
          'its streams, build the target for real, or convert without target and '
          'nnx.update(model, state)',
          abstract,
      )
    seeds = _stream_seeds(variables, found, rngs) if rngs is not None and found else None
    return cls(graphdef, variables, frozenset(found), seeds, kept)

  @property
  def leaves(self) -> dict[tuple, tuple[Any, md.Annotation]]:
    """`{path: (value, annotation)}` to fill: every Variable but RNG state."""
    return {p: (v, a) for p, (v, a, _) in self.variables.items() if p not in self.rng_paths}

  def check_kind(self, table: CollectionTable, converted: Mapping[str, Mapping[tuple, Any]]):
    """`fill`'s check that the target holds a Variable of the leaf's
    collection; `converted` holds the model's converted leaves by collection."""
    collection_of = {p: c for c, flat in converted.items() for p in flat}

    def check(path: tuple, name: str) -> None:
      if path[0] == 'model':
        check_collection(name, collection_of[path[1:]], self.variables[path][2], table)
    return check

  def check_metadata(self, path: tuple, name: str, annotation: md.Annotation) -> None:
    """`fill`'s check that the target Variable takes the leaf's extra metadata."""
    t_value, _, t_var = self.variables[path]
    check_fills(name, t_var, t_value, annotation)

  def merge(self, filled, value_of: Callable[[Any], Any]):
    """The new model, or `(model, optimizer)`, holding the filled leaves."""
    new_flat = {  # Variables of their own; a numpy attribute copied, a jax.Array is immutable
        p: leaf.replace(leaf.get_raw_value()) if isinstance(leaf, nnx.Variable)
        else np.array(leaf) if isinstance(leaf, np.ndarray) else leaf
        for p, leaf in self.kept.items()
    }
    for path, (_, _, t_var) in self.variables.items():
      if path in self.rng_paths:  # a Variable of its own: the target is never modified
        new_flat[path] = t_var.replace(t_var.get_raw_value())
        continue
      value, annotation = filled[path]
      new_var = t_var.replace(value_of(value))
      for key, extra in (annotation.extra if annotation is not None else ()):
        new_var.set_metadata(key, extra)
      new_flat[path] = new_var
    objects = nnx.merge(self.graphdef, nnx.State(nest(new_flat)))
    if self.seeds is not None:
      nnx.reseed(objects['model'], policy='match_shape', **self.seeds)
    return (objects['model'], objects['optimizer']) if 'optimizer' in objects else objects['model']


def check_untrained(only: Mapping[tuple, Any], optimizer, where: str) -> None:
  """Refuses state only NNX has that `optimizer` trains (its `wrt`): its
  optimizer state would have no Linen counterpart either."""
  trains = nnx.filterlib.to_predicate(getattr(optimizer, 'wrt', nnx.Param))
  trained = [
      f'{where}/{format_path(p)}' for p, leaf in only.items()
      if isinstance(leaf, nnx.Variable) and trains(p, leaf)
  ]
  if trained:
    raise StructureError(
        f'{format_offenders(trained)}: named by a one-sided rule (state only NNX has), '
        'but the optimizer trains it: its optimizer state has no Linen counterpart to '
        'convert',
        trained,
        fix='hold a constant the port computes once in an nnx.Variable the optimizer does '
        'not train, or give it a Linen counterpart and a two-sided rule',
    )


def _check_kept(kept: Mapping[tuple, Any]) -> None:
  """Refuses state only NNX has that an abstract target holds no value of."""
  abstract = [
      format_path(p) for p, leaf in kept.items()
      if isinstance(leaf.get_raw_value() if isinstance(leaf, nnx.Variable) else leaf, jax.ShapeDtypeStruct)
  ]
  if abstract:
    raise StructureError(
        f'the target is abstract where it holds state only NNX has: {format_offenders(abstract)}; '
        'a one-sided rule keeps the target\'s value there, and Linen has none to give',
        abstract,
        fix='build the target for real (its constructor computes that state), or convert '
        'without target and nnx.update(model, state)',
    )


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


def check_collection(where: str, collection: str, t_var: nnx.Variable, table: CollectionTable) -> None:
  wanted = table.by_name[collection]
  if table.collection(t_var, where) != collection:
    raise StructureError(
        f'{where}: converted from the Linen {collection!r} collection '
        f'({wanted.__name__} Variables), but the target holds a {type(t_var).__name__} there; '
        'map the path to a Variable of the same kind, or pass collections=... '
        'to say which type the collection has',
        [where],
    )


def check_fills(where: str, t_var: nnx.Variable, t_value, annotation: md.Annotation) -> None:
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

