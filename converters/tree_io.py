"""Framework trees as flat maps, and the checks every conversion shares.

`read_linen_tree` and `read_nnx_state` turn a boxed Linen tree or an
`nnx.State` into `{path: (array, Annotation, ...)}`, refusing leaves that are
not arrays. A `Batch` plans path translation and relayout on such maps
(`converters.layout`) and builds the arrays only once every tree of the input
and every check against the target has passed; `convert_flat` is a batch of
one. `nest` builds nested dicts back. `check_keys` and `check_against_template` compare a
conversion with the target structure it fills, and `scalar_like` converts step
counters between Linen's and NNX's integer dtypes.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from converters import layout
from converters import metadata as md
from converters import provenance
from converters.errors import (
    AnnotationError,
    LayoutError,
    OptimizerStateError,
    ShapeError,
    StructureError,
    format_offenders,
)
from converters import paths as path_mapping
from converters.paths import Framework, PathMapping, as_mapping, format_path


@dataclasses.dataclass(frozen=True)
class Options:
  """What every conversion is told: see `linen_to_nnx`. Checked when made."""

  paths: PathMapping | None = None
  scan: bool | None = None
  layer_partition: str | None = None
  num_layers: int | None = None
  mesh: Mesh | None = None
  rules: tuple | None = None
  donate: bool = False
  strict: bool = False
  #: The rules of an enclosing `nn.logical_axis_rules(...)`, read when made.
  context_rules: tuple | None = dataclasses.field(init=False, default=None)

  def __post_init__(self):
    context = tuple(tuple(r) for r in nn.get_logical_axis_rules() or ())
    object.__setattr__(self, 'context_rules', context or None)
    if self.paths is not None:
      object.__setattr__(self, 'paths', as_mapping(self.paths))
    if self.scan not in (None, True, False):
      raise LayoutError(f'scan={self.scan!r}: pass True (stacked), False (looped) or None (as the source)')
    if self.num_layers is not None and (
        isinstance(self.num_layers, bool) or not isinstance(self.num_layers, (int, np.integer))
        or self.num_layers < 0
    ):
      raise LayoutError(f'num_layers={self.num_layers!r}: pass a non-negative int, or None to infer it')
    if self.layer_partition is not None and not isinstance(self.layer_partition, str):
      raise LayoutError(f'layer_partition={self.layer_partition!r}: pass an axis name (str) or None')
    if self.mesh is not None and not isinstance(self.mesh, Mesh):
      raise AnnotationError(f'mesh={self.mesh!r}: pass a jax.sharding.Mesh or None')
    if self.rules is not None:
      try:
        rules = tuple((name, axis) for name, axis in self.rules)
      except (TypeError, ValueError):
        raise AnnotationError(
            f'rules={self.rules!r}: pass logical rules as (name, mesh axis) pairs, '
            "e.g. (('embed', None), ('hidden', 'model'))"
        ) from None
      object.__setattr__(self, 'rules', rules)
    if not isinstance(self.donate, bool):
      raise StructureError(f'donate={self.donate!r}: pass True or False')
    if not isinstance(self.strict, bool):
      raise AnnotationError(f'strict={self.strict!r}: pass True or False')

  @property
  def resolution_rules(self) -> tuple | None:
    """What resolves logical names that carry no rules: `rules=`, else the context's."""
    return self.rules if self.rules is not None else self.context_rules


# -- reading each side -------------------------------------------------------------


def key_of(k) -> Any:
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return getattr(k, attr)
  raise StructureError(f'unsupported pytree key {k!r}')


def keys_of(keypath) -> tuple:
  return tuple(key_of(k) for k in keypath)


def check_array(value, where: str) -> None:
  """Raises `StructureError` unless `value` is an array (or an abstract one)."""
  if value is None:
    raise StructureError(
        f'{where}: is None; every parameter must be an array (remove the entry '
        'or give it its value)',
        [where],
    )
  if not (hasattr(value, 'shape') and hasattr(value, 'dtype')) or isinstance(value, (str, bytes)):
    raise StructureError(
        f'{where}: is a {type(value).__name__}, not an array; parameters must be '
        'jax.Array, np.ndarray or jax.ShapeDtypeStruct (wrap scalars with '
        'jnp.asarray)',
        [where],
    )


def read_linen_tree(
    tree, where: str, strict: bool = False
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


def read_nnx_state(
    state, where: str, rules: tuple | None = None
) -> dict[tuple, tuple[Any, md.Annotation, nnx.Variable]]:
  """`{path: (array, annotation, variable)}` of an `nnx.State`.

  Names of Variables without `sharding_rules` are read as NNX reads them
  under `rules` (the conversion's, or the context's): see `md.as_logical`.
  """
  flat = {}
  for path, variable in nnx.to_flat_state(state):
    where_leaf = f'{where}/{format_path(path)}'
    if not isinstance(variable, nnx.Variable):
      raise StructureError(f'{where_leaf}: not an nnx.Variable', [format_path(path)])
    value, annotation = md.read_nnx(variable, where_leaf)
    check_array(value, where_leaf)
    flat[tuple(path)] = (value, md.as_logical(annotation, rules, where_leaf), variable)
  return flat


# -- parameters ----------------------------------------------------------------------


class Pending:
  """A target array that `Batch.run` has yet to build: its shape, dtype and sharding."""

  def __init__(self, shape: tuple[int, ...], dtype, sharding):
    self.shape, self.dtype, self.sharding = tuple(shape), dtype, sharding

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def __repr__(self) -> str:
    return f'Pending({self.shape}, {self.dtype}, {self.sharding})'


class Batch:
  """The conversions of one input's trees, all checked before any array is built.

  `plan` checks a flat tree of one side and returns every target leaf: the
  input array where its layout is kept, a `Pending` one where it changes.
  Callers check those against their target; `run` then builds every pending
  array, deleting donated sources, so a check that fails late leaves the
  input whole. A buffer that two input leaves share (tied weights, an array
  passed twice, a scalar passed through) is never deleted.
  """

  def __init__(self, options: Options):
    self.options = options
    self._jobs: list[tuple] = []
    self._inputs: list[Any] = []
    self._built: dict[int, Any] = {}

  def plan(self, flat, source: Framework, target: Framework) -> dict[tuple, tuple[Any, md.Annotation]]:
    """`{target path: (array or Pending, annotation)}`; raises before anything is built."""
    options = self.options
    pairs = {p: (v[0], v[1]) for p, v in flat.items()}
    if jax.process_count() > 1:
      agree_on_conversion(pairs, source, target, options)
    layout.check_placement(pairs, options.mesh, options.resolution_rules)
    mapping = path_mapping.resolve(options.paths)
    if (options.scan is not None or options.num_layers is not None) and not any(
        rule.layered for rule in mapping.rules
    ):
      asked = 'scan' if options.num_layers is None else 'num_layers'
      raise LayoutError(
          f'{asked}={getattr(options, asked)!r}: no PathRule of the mapping has layers '
          '({i}), so no path is a layer to stack, unstack or count; pass paths= with '
          "layer rules (PathRule(linen='Block_{i}/...', nnx='blocks/{i}/...', "
          'linen_stacked=..., nnx_stacked=...)), or leave scan and num_layers out'
      )
    targets = layout.plan(
        pairs, mapping, source, target, scan=options.scan, layer_partition=options.layer_partition,
        num_layers=options.num_layers, rules=options.resolution_rules,
    )
    if options.rules is not None:
      targets = {
          p: dataclasses.replace(t, annotation=md.with_default_rules(t.annotation, options.rules))
          for p, t in targets.items()
      }
    shardings = layout.target_shardings(targets, pairs, options.mesh, options.resolution_rules)
    layout.check_executable(targets, pairs, shardings)
    for path, t in targets.items():
      check_writable(format_path(path), t.shape, t.dtype, t.annotation, target)
    planned = {}
    for path, t in targets.items():
      if t.kept:
        planned[path] = (pairs[t.sources[0]][0], t.annotation)
      else:
        planned[path] = (Pending(t.shape, t.dtype, shardings[path]), t.annotation)
    self._inputs.extend(v for v, _ in pairs.values())
    self._jobs.append((targets, pairs, shardings, planned))
    return planned

  def protect(self, values) -> None:
    """Input arrays used outside the planned trees (steps, counts): never deleted."""
    self._inputs.extend(values)

  def run(self) -> None:
    uses = collections.Counter()
    for value in self._inputs:
      uses.update(layout.buffer_keys(value))
    shared = frozenset(key for key, n in uses.items() if n > 1)
    for targets, pairs, shardings, planned in self._jobs:
      arrays = layout.execute(targets, pairs, shardings, self.options.donate, shared)
      for path, (value, _) in planned.items():
        if isinstance(value, Pending):
          self._built[id(value)] = arrays[path]
    self._jobs = []

  def value(self, value):
    """The array a planned value stands for (after `run`)."""
    return self._built[id(value)] if isinstance(value, Pending) else value


def check_writable(where: str, shape, dtype, annotation: md.Annotation, target: Framework) -> None:
  """The annotation makes a valid box or Variable (metadata NNX refuses is caught here)."""
  placeholder = jax.ShapeDtypeStruct(tuple(shape), dtype)
  try:
    if target == 'nnx':
      md.write_nnx(nnx.Param, placeholder, annotation)
    else:
      md.write_linen(placeholder, annotation)
  except (ValueError, TypeError, AttributeError) as e:
    raise AnnotationError(
        f'{where}: its metadata {dict(annotation.extra)} cannot be written to a '
        f'{"Variable" if target == "nnx" else "Linen box"}: {e}; drop or rename '
        'those metadata keys',
        [where],
    ) from e


def convert_flat(flat, source: Framework, target: Framework, options: Options):
  """`{target path: (array, annotation)}` for a flat tree of one side."""
  batch = Batch(options)
  planned = batch.plan(flat, source, target)
  batch.run()
  return {p: (batch.value(v), a) for p, (v, a) in planned.items()}


def agree_on_conversion(pairs, source: Framework, target: Framework, options: Options) -> None:
  """Every process converts the same tree the same way (see `converters.distributed`)."""
  from converters.distributed import agree

  agree(
      f'{source} -> {target} conversion',
      {
          'options': {
              'scan': options.scan, 'layer_partition': options.layer_partition,
              'num_layers': options.num_layers,
          },
          'leaves': {
              format_path(p): [list(v.shape), str(v.dtype), repr(a.names), repr(a.rules)]
              for p, (v, a) in pairs.items()
          },
      },
  )


def nest(flat: Mapping[tuple, Any]) -> dict:
  root: dict = {}
  for path, value in flat.items():
    node = root
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return root


def scalar_like(value, template_dtype, mesh: Mesh | None, where: str):
  """An optimizer scalar in the other side's form: a step or count converted to
  its integer dtype (refused if it does not fit), any other scalar (a
  hyperparameter of `optax.inject_hyperparams`) kept as it is, of the same dtype."""
  shape = tuple(value.shape) if hasattr(value, 'shape') else np.shape(value)
  if shape != ():
    raise ShapeError(
        f'{where}: expected a scalar (a step, count or hyperparameter), found shape {shape}',
        [where],
    )
  dtype = value.dtype if hasattr(value, 'dtype') else np.asarray(value).dtype
  if not np.issubdtype(np.dtype(template_dtype), np.integer):
    if np.dtype(dtype) != np.dtype(template_dtype):
      raise ShapeError(
          f'{where}: is {np.dtype(dtype)}, the target holds {np.dtype(template_dtype)}',
          [where],
          fix='build the target with the same optimizer, hyperparameters of the same dtype',
      )
    return _placed_scalar(value, mesh)
  if np.dtype(dtype).kind not in 'iu':
    raise ShapeError(
        f'{where}: is {value!r} of dtype {dtype}, not an integer; a step or count '
        'must be an integer so no value is rounded',
        [where],
    )
  if isinstance(value, jax.ShapeDtypeStruct):  # an abstract state gives an abstract step
    sharding = NamedSharding(mesh, PartitionSpec()) if mesh else value.sharding
    return provenance.record(
        jax.ShapeDtypeStruct((), np.dtype(template_dtype), sharding=sharding),
        provenance.Derivation('cast', (value,), dtype=np.dtype(template_dtype)),
    )
  try:
    number = int(np.asarray(value))
  except Exception:  # an array this process cannot read whole: its dtype was checked
    number = None
  limits = np.iinfo(template_dtype)
  if number is not None and not limits.min <= number <= limits.max:
    raise ShapeError(
        f'{where}: {number} does not fit the target\'s {np.dtype(template_dtype)} '
        f'[{limits.min}, {limits.max}]',
        [where],
    )
  if isinstance(value, jax.Array):
    return value if value.dtype == template_dtype else value.astype(template_dtype)
  array = np.asarray(value, dtype=template_dtype)
  return jax.device_put(array, NamedSharding(mesh, PartitionSpec())) if mesh else jnp.asarray(array)


def _placed_scalar(value, mesh: Mesh | None):
  """A scalar kept as it is: the input array itself, or placed replicated."""
  if isinstance(value, jax.ShapeDtypeStruct):
    sharding = NamedSharding(mesh, PartitionSpec()) if mesh else value.sharding
    return provenance.record(
        jax.ShapeDtypeStruct((), value.dtype, sharding=sharding),
        provenance.Derivation('keep', (value,)),
    )
  if isinstance(value, jax.Array):
    return value
  array = np.asarray(value)
  return jax.device_put(array, NamedSharding(mesh, PartitionSpec())) if mesh else jnp.asarray(array)


def mesh_of_tree(flat) -> Mesh | None:
  for value, *_ in flat.values():
    sharding = getattr(value, 'sharding', None)
    if isinstance(sharding, NamedSharding):
      return sharding.mesh
  return None


def _mesh(value) -> Mesh | None:
  sharding = getattr(value, 'sharding', None)
  return sharding.mesh if isinstance(sharding, NamedSharding) else None


def _same_mesh(a, b) -> bool:
  if isinstance(a, Mesh) and isinstance(b, Mesh):
    return a == b  # axis names, sizes and device order
  return dict(a.shape) == dict(b.shape) and tuple(a.axis_names) == tuple(b.axis_names)


def check_against_template(path: str, value, annotation, t_value, t_annotation, rules=None):
  """The converted leaf fits the target's: shape, dtype, mesh and annotation.

  Annotations agree when they are the same, or when they resolve to the same
  mesh axes (logical names on one side, the mesh axes they resolve to on the
  other; a shorter list of names, trailing dimensions replicated). `rules`
  (the conversion's `rules=`, else the context's) resolves logical names that
  carry no rules, on either side.
  """
  mesh, t_mesh = _mesh(value), _mesh(t_value)
  if mesh is not None and t_mesh is not None and not _same_mesh(mesh, t_mesh):
    raise LayoutError(
        f'{path}: the converted array lives on mesh {layout.describe_mesh(mesh)} but the '
        f'target is on mesh {layout.describe_mesh(t_mesh)}; build the target on the same '
        'mesh, or jax.device_put the source onto the target mesh before converting',
        [path],
    )
  if tuple(value.shape) != tuple(t_value.shape):
    raise ShapeError(
        f'{path}: converted shape {tuple(value.shape)}, target expects '
        f'{tuple(t_value.shape)}',
        [path],
        fix='build the target from the same configuration (widths, heads, layer '
        'counts) as the source, or convert with the target\'s layout (scan=..., '
        'num_layers=...); if a rule pairs parameters of different shapes, fix it (paths=)',
    )
  if value.dtype != t_value.dtype:
    raise ShapeError(
        f'{path}: converted dtype {value.dtype}, target expects {t_value.dtype}',
        [path],
        fix='cast the source or build the target with the same dtype (param_dtype=...)',
    )
  if t_annotation is None or _same_form(annotation, t_annotation, rules):
    return
  mine, theirs = (
      _padded_axes(a, len(value.shape), path, rules) for a in (annotation, t_annotation)
  )
  if mine != theirs:
    raise AnnotationError(
        f'{path}: converted annotation names={annotation.names} '
        f'rules={annotation.rules} resolves to {PartitionSpec(*mine)}, target has '
        f'names={t_annotation.names} rules={t_annotation.rules} resolving to '
        f'{PartitionSpec(*theirs)}; build the target with the same '
        'annotations (or convert with layer_partition=... or rules=... to match it)',
        [path],
    )


def _same_form(annotation: md.Annotation, t_annotation: md.Annotation, rules) -> bool:
  if rules is not None:
    annotation = md.with_default_rules(annotation, rules)
    t_annotation = md.with_default_rules(t_annotation, rules)
  return (annotation.names, annotation.rules) == (t_annotation.names, t_annotation.rules)


def _padded_axes(annotation: md.Annotation, rank: int, path: str, rules) -> tuple:
  axes = md.mesh_axes(annotation, path, rules)
  return tuple(axes) + (None,) * (rank - len(axes))


def in_target_form(annotation: md.Annotation, t_annotation: md.Annotation | None) -> md.Annotation:
  """The annotation to write for a leaf that `check_against_template` accepted:
  the target's form (names, rules, mesh), with the converted leaf's extra metadata."""
  if t_annotation is None or (annotation.names, annotation.rules, annotation.logical) == (
      t_annotation.names, t_annotation.rules, t_annotation.logical
  ):
    return annotation
  return dataclasses.replace(t_annotation, extra=annotation.extra)


def check_keys(where: str, wanted, given, explain=None):
  """Raises unless `given` (the converted leaves) has exactly the paths of
  `wanted` (the target's), listing every path missing and unexpected.

  `explain(path, missing)`, when given, says for one path why (which rule
  of the path mapping names it, or that none does), or returns None.
  """
  missing = sorted(set(wanted) - set(given), key=format_path)
  unexpected = sorted(set(given) - set(wanted), key=format_path)
  if missing or unexpected:
    def listed(paths, is_missing):
      notes = [explain(p, is_missing) if explain else None for p in paths]
      return [format_path(p) + (f' ({n})' if n else '') for p, n in zip(paths, notes)]

    offenders = [format_path(p) for p in missing + unexpected]
    in_optimizer = all(p.startswith(('optimizer/', 'opt_state')) for p in offenders)
    error = OptimizerStateError if in_optimizer or 'opt_state' in where else StructureError
    parts = []
    if missing:
      parts.append(f'the source lacks [{format_offenders(listed(missing, True))}]')
    if unexpected:
      parts.append(
          f'has [{format_offenders(listed(unexpected, False))}] that the target lacks'
          if missing else
          f'the source has [{format_offenders(listed(unexpected, False))}] that the target lacks'
      )
    raise error(
        f'{where}: {" and ".join(parts)} (target-side paths, after the path mapping)',
        offenders,
        fix='if a rule maps to a path the target does not have, or no rule produces '
        'one it has, fix the rules (paths=); else convert between models of the same '
        'configuration, optimizer and layout',
    )
