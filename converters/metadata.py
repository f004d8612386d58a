"""Sharding metadata in one neutral form, read from and written to either framework.

An `Annotation` is what a Linen box or an NNX Variable says about its array:
the names of its dimensions (`Partitioned.names` / `out_sharding`), the logical
rules that resolve them (`LogicallyPartitioned.rules` / `sharding_rules`), the
box's mesh, and every other metadata entry, carried through unchanged.

Reading and writing go through Flax's own `to_nnx_metadata` /
`from_nnx_metadata`, guarded against their defects: `LogicallyPartitioned.
to_nnx_metadata()` pops fields out of the box it is called on (it is called
on a copy, `compat.to_nnx_metadata`), and `from_nnx_metadata` pops keys out
of the dict it is given (it gets one of its own). NNX's legacy `sharding` / `sharding_names` keys are read as
`out_sharding`. Linen boxes cannot hold arbitrary metadata, so metadata that
has no Linen field travels in `CarryingPartitioned` / `CarryingLogicallyPartitioned`
/ `Annotated`, which Linen treats as ordinary boxes.

`add_layer_axis` / `remove_layer_axis` insert and remove the stacked layer
axis name exactly as `nn.scan(metadata_params=...)` and
`nnx.vmap/scan(transform_metadata=...)` do; `resolve` turns names into a
`PartitionSpec` on a mesh and rejects what Linen and NNX would read differently.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import config as flax_config
from flax import linen as nn
from flax import nnx, struct
from flax.core import meta
from jax.sharding import Mesh, PartitionSpec

from converters import compat
from converters.errors import AnnotationError

__all__ = ['CarryingLogicallyPartitioned', 'CarryingPartitioned']

#: NNX Variable configuration that every Variable carries.
_NNX_CONFIG_KEYS = ('hijax', 'ref', 'eager_sharding')
_LEGACY_NNX_KEYS = ('sharding', 'sharding_names')


def _nnx_config_defaults() -> dict[str, Any]:
  return {
      'hijax': False,
      'ref': False,
      'eager_sharding': flax_config.flax_always_shard_variable,
  }


@dataclasses.dataclass(frozen=True)
class Annotation:
  """A parameter's sharding metadata, independent of the framework.

  Attributes:
    names: one name (or None) per array dimension, or None if unannotated.
    rules: logical rules attached to the parameter, or None.
    logical: whether `names` are logical names (Linen `LogicallyPartitioned`,
      NNX `sharding_rules`) rather than mesh axes.
    mesh: the mesh attached to the box or Variable, or None.
    extra: every other metadata entry, as sorted `(key, value)` pairs.
  """

  names: tuple | None = None
  rules: tuple | None = None
  logical: bool = False
  mesh: Mesh | None = None
  extra: tuple[tuple[str, Any], ...] = ()


# -- Linen boxes that carry metadata Linen has no field for -----------------------


class CarryingPartitioned(nn.Partitioned):
  """`nn.Partitioned` plus NNX metadata that has no Linen field."""

  extra: tuple = struct.field(default=(), pytree_node=False)


class CarryingLogicallyPartitioned(nn.LogicallyPartitioned):
  """`nn.LogicallyPartitioned` plus NNX metadata that has no Linen field."""

  extra: tuple = struct.field(default=(), pytree_node=False)


class Annotated(struct.PyTreeNode, meta.AxisMetadata):
  """An unpartitioned Linen parameter that carries NNX metadata."""

  value: Any
  extra: tuple = struct.field(default=(), pytree_node=False)

  def unbox(self):
    return self.value

  def replace_boxed(self, val):
    return self.replace(value=val)

  def add_axis(self, index, params):
    return self

  def remove_axis(self, index, params):
    return self


_LINEN_BOXES = (
    nn.Partitioned,
    nn.LogicallyPartitioned,
    CarryingPartitioned,
    CarryingLogicallyPartitioned,
    Annotated,
)


def is_linen_box(x) -> bool:
  return isinstance(x, meta.AxisMetadata)


# -- reading ---------------------------------------------------------------------


def _freeze(items: dict) -> tuple:
  return tuple(sorted(items.items()))


def read_linen(leaf, path: str) -> tuple[Any, Annotation]:
  """`(array, annotation)` of a Linen params leaf, boxed or not; never mutates it."""
  if not is_linen_box(leaf):
    return leaf, Annotation()
  if type(leaf) not in _LINEN_BOXES:
    raise AnnotationError(
        f'{path}: box type {type(leaf).__name__} is not one the converters know '
        '(nn.Partitioned, nn.LogicallyPartitioned); unbox it or convert it to '
        'one of those first',
        [path],
    )
  extra = dict(getattr(leaf, 'extra', ()))
  if isinstance(leaf, Annotated):
    return leaf.value, Annotation(extra=_freeze(extra))
  metadata = compat.to_nnx_metadata(leaf)
  metadata.pop('extra', None)
  value = metadata.pop('value')
  names = metadata.pop('out_sharding')
  logical = isinstance(leaf, nn.LogicallyPartitioned)
  rules = metadata.pop('sharding_rules', None)
  mesh = metadata.pop('mesh', None)
  extra.update(metadata)
  return value, Annotation(
      names=None if names is None else tuple(names),
      rules=None if rules is None else tuple(tuple(r) for r in rules),
      logical=logical,
      mesh=mesh,
      extra=_freeze(extra),
  )


def read_nnx(variable: nnx.Variable, path: str) -> tuple[Any, Annotation]:
  """`(array, annotation)` of an NNX Variable; never mutates it."""
  metadata = dict(variable.get_metadata())
  names = metadata.pop('out_sharding', None)
  for key in _LEGACY_NNX_KEYS:
    legacy = metadata.pop(key, None)
    if legacy is None:
      continue
    if names is not None and tuple(names) != tuple(legacy):
      raise AnnotationError(
          f'{path}: out_sharding={tuple(names)} and legacy {key}={tuple(legacy)} '
          'disagree; keep only out_sharding',
          [path],
      )
    names = legacy
  rules = metadata.pop('sharding_rules', None)
  mesh = metadata.pop('mesh', None)
  defaults = _nnx_config_defaults()
  for key in _NNX_CONFIG_KEYS:
    if key in metadata and metadata[key] == defaults[key]:
      del metadata[key]
  if isinstance(names, jax.sharding.NamedSharding):
    mesh, names = names.mesh, tuple(names.spec)
  return variable.get_value(), Annotation(
      names=None if names is None else tuple(names),
      rules=None if rules is None else tuple(tuple(r) for r in rules),
      logical=rules is not None,
      mesh=mesh,
      extra=_freeze(metadata),
  )


# -- writing ---------------------------------------------------------------------


def nnx_metadata(annotation: Annotation) -> dict[str, Any]:
  """The keyword metadata of an NNX Variable for `annotation`."""
  metadata = dict(annotation.extra)
  if annotation.names is not None:
    metadata['out_sharding'] = annotation.names
  if annotation.rules is not None:
    metadata['sharding_rules'] = annotation.rules
  if annotation.mesh is not None:
    metadata['mesh'] = annotation.mesh
  return metadata


def write_nnx(variable_type: type, value, annotation: Annotation) -> nnx.Variable:
  """A Variable holding `value` itself (no copy, no resharding)."""
  metadata = nnx_metadata(annotation)
  eager = metadata.pop('eager_sharding', _nnx_config_defaults()['eager_sharding'])
  # Eager sharding would re-place an array that is already placed; skip it,
  # then record the flag the Variable should carry.
  variable = variable_type(value, eager_sharding=False, **metadata)
  variable.set_metadata(eager_sharding=eager)
  return variable


def write_linen(value, annotation: Annotation):
  """A Linen params leaf for `annotation`: a box, or the bare array."""
  extra = annotation.extra
  if annotation.names is None:
    return Annotated(value, extra=extra) if extra else value
  # from_nnx_metadata pops keys from the dict it gets: give it a fresh one.
  metadata = {'value': value, 'out_sharding': annotation.names}
  if annotation.mesh is not None:
    metadata['mesh'] = annotation.mesh
  if annotation.logical:
    metadata['sharding_rules'] = annotation.rules
    box_type = CarryingLogicallyPartitioned if extra else nn.LogicallyPartitioned
  else:
    box_type = CarryingPartitioned if extra else nn.Partitioned
  box = box_type.from_nnx_metadata(metadata)
  return box.replace(extra=extra) if extra else box


def with_default_rules(annotation: Annotation, rules: tuple | None) -> Annotation:
  """A logical annotation that carries no rules, given `rules`."""
  if annotation.logical and annotation.rules is None and rules is not None:
    return dataclasses.replace(annotation, rules=tuple(tuple(r) for r in rules))
  return annotation


# -- layer axis --------------------------------------------------------------------


def add_layer_axis(annotation: Annotation, name: str | None) -> Annotation:
  """The annotation of a stacked parameter: `name` inserted as names[0]."""
  if annotation.names is None:
    return annotation
  return dataclasses.replace(annotation, names=(name,) + annotation.names)


def remove_layer_axis(annotation: Annotation, path: str) -> tuple[Annotation, str | None]:
  """The annotation of one layer of a stacked parameter, and the removed name."""
  if annotation.names is None:
    return annotation, None
  if not annotation.names:
    raise AnnotationError(f'{path}: a stacked parameter has no layer axis name', [path])
  return dataclasses.replace(annotation, names=annotation.names[1:]), annotation.names[0]


# -- resolution ----------------------------------------------------------------------


def _is_axis(name) -> bool:
  return name is None or isinstance(name, str) or (
      isinstance(name, tuple) and all(isinstance(a, str) for a in name)
  )


def resolve(
    annotation: Annotation,
    shape: tuple[int, ...],
    mesh: Mesh | None,
    path: str,
    rules: tuple | None = None,
) -> PartitionSpec | None:
  """The mesh `PartitionSpec` of `annotation`, checked against `shape` and `mesh`.

  With no mesh, only the names and rules are checked and None is returned.

  Raises `AnnotationError` for names that do not fit the array, logical names
  with no rule (NNX would read them as mesh axes, Linen would replicate them),
  a logical name that reaches the same mesh axis twice (Linen drops the second
  one, NNX keeps both), mesh axes the mesh lacks and dimensions a mesh axis
  does not divide.
  """
  names = annotation.names
  if names is None:
    return PartitionSpec()
  if not all(_is_axis(n) for n in names):
    raise AnnotationError(
        f'{path}: sharding names {names} hold something other than a name, None '
        "or a tuple of names; write each dimension as 'model', None or ('data', 'model')",
        [path],
    )
  if len(names) > len(shape):
    raise AnnotationError(
        f'{path}: {len(names)} sharding names {names} for an array of rank '
        f'{len(shape)} {tuple(shape)}; give at most one name (or None) per dimension',
        [path],
    )
  axes = mesh_axes(annotation, path, rules)
  axes += [None] * (len(shape) - len(axes))  # trailing dimensions replicated, as JAX reads it
  if mesh is None:
    return None
  mesh_axis_names = [
      a for axis in axes if axis is not None
      for a in (axis if isinstance(axis, tuple) else (axis,))
  ]
  missing = [a for a in mesh_axis_names if a not in mesh.shape]
  if missing:
    raise AnnotationError(
        f'{path}: mesh axes {missing} (from names {names}) are not in the mesh '
        f'{dict(mesh.shape)}; use one of {tuple(mesh.shape)} or None',
        [path],
    )
  repeated = sorted({a for a in mesh_axis_names if mesh_axis_names.count(a) > 1})
  if repeated:
    raise AnnotationError(
        f'{path}: names {names} put mesh axes {repeated} on more than one '
        'dimension; Linen and NNX resolve that differently, map one of them '
        'to None',
        [path],
    )
  for dim, (size, axis) in enumerate(zip(shape, axes)):
    if axis is None:
      continue
    parts = axis if isinstance(axis, tuple) else (axis,)
    ways = 1
    for a in parts:
      ways *= mesh.shape[a]
    if size % ways:
      raise AnnotationError(
          f'{path}: dimension {dim} of size {size} is not divisible by mesh '
          f'axis {axis!r} of size {ways} (names {names}); change the name or '
          'the shape',
          [path],
      )
  return PartitionSpec(*axes)


def mesh_axes(annotation: Annotation, path: str, rules: tuple | None = None) -> list:
  """The mesh axis (or None, or a tuple of axes) of each named dimension.

  Logical names resolve through the annotation's own rules, else `rules`
  (the conversion's `rules=` or the `nn.logical_axis_rules` context). Only
  the given names are resolved: dimensions past them are replicated.
  """
  names = annotation.names or ()
  if not annotation.logical:
    return list(names)
  rules = annotation.rules if annotation.rules is not None else rules
  if not all(isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str) and _is_axis(r[1]) for r in rules or ()):
    raise AnnotationError(
        f'{path}: logical rules {rules} are not (name, mesh axis) pairs; write '
        "each as ('embed', 'model'), ('embed', None) or ('embed', ('data', 'model'))",
        [path],
    )
  table = dict(rules or ())
  unruled = [n for n in names if n is not None and n not in table]
  if unruled:
    raise AnnotationError(
        f'{path}: logical names {unruled} have no rule in {tuple(rules or ())}; '
        f'add a rule for each, e.g. ({unruled[0]!r}, None), in the box, in '
        'rules=... or in nn.logical_axis_rules(...) around the conversion',
        [path],
    )
  axes = [None if n is None else table[n] for n in names]  # NNX: the last rule of a name
  repeated = sorted({n for n, _ in rules if n in names and sum(r[0] == n for r in rules) > 1})
  if repeated:
    linen = list(nn.logical_to_mesh_axes(names, rules))  # the first rule claiming a free axis
    if [None if a is None else a for a in linen] != axes:
      raise AnnotationError(
          f'{path}: the rules name {repeated} more than once, and Linen (the first rule '
          f'that claims a free mesh axis: {PartitionSpec(*linen)}) and NNX (the last '
          f'rule: {PartitionSpec(*axes)}) resolve names {names} differently; keep one '
          'rule per logical name',
          [path],
      )
  return axes


def as_logical(annotation: Annotation, rules: tuple | None, path: str) -> Annotation:
  """An NNX annotation without `sharding_rules`, read as NNX reads it under `rules`.

  NNX resolves the names of such a Variable with the rules in context (the
  idiom of ports that keep logical names and wrap creation and use in
  `nn.logical_axis_rules(...)`). When every name is one of the rules' logical
  names, the annotation is logical (rules from the context, none stored);
  when none is, the names are mesh axes. A mix is refused: NNX would pass the
  unruled names through as mesh axes, Linen would replicate them.
  """
  if annotation.logical or not annotation.names or not rules:
    return annotation
  table = dict(rules)
  named = [n for n in annotation.names if n is not None]
  ruled = [n for n in named if isinstance(n, str) and n in table]
  if not ruled:
    return annotation
  if len(ruled) != len(named):
    unruled = [n for n in named if n not in ruled]
    raise AnnotationError(
        f'{path}: names {annotation.names} mix logical names {ruled} (in the rules) '
        f'with names {unruled} that no rule has; NNX would read {unruled} as mesh '
        'axes and Linen would replicate them: add a rule for each or write all '
        'of them as mesh axes',
        [path],
    )
  return dataclasses.replace(annotation, logical=True)
