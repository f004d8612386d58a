"""Every refusal of a conversion, made before any array is built.

What the input must satisfy (arrays placed where their annotations say,
alive, on one mesh; every process converting the same tree), what a plan
must satisfy (`check_plan`, `check_layer_rules`, `check_executable`,
`check_writable`; the shardings a target asks for, `converters.sharding`) and what a converted leaf must share
with the target leaf it fills (`check_keys`, `check_against_template`). Each
raises a `ConversionError` naming every offending path and saying how to fix
it.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from converters import metadata as md
from converters.errors import (
    AnnotationError,
    LayoutError,
    OptimizerStateError,
    PathMappingError,
    ShapeError,
    StructureError,
    format_offenders,
)
from converters.options import Options
from converters.paths import Framework, PathMapping, format_path
from converters.planning import Flat, Plan, Target
from converters.sharding import describe_mesh, mesh_of


def check_layer_rules(options: Options) -> None:
  """`scan=` and `num_layers=` need a mapping with layer rules to act on."""
  if (options.scan is not None or options.num_layers is not None) and not any(
      rule.layered for rule in options.paths.rules
  ):
    asked = 'scan' if options.num_layers is None else 'num_layers'
    raise LayoutError(
        f'{asked}={getattr(options, asked)!r}: no PathRule of the mapping has layers '
        '({i}), so no path is a layer to stack, unstack or count; pass paths= with '
        "layer rules (PathRule(linen='Block_{i}/...', nnx='blocks/{i}/...', "
        'linen_stacked=..., nnx_stacked=...)), or leave scan and num_layers out'
    )


def check_plan(plan: Plan) -> None:
  """Raises the plan's refusal, naming every offender, if it has one."""
  if (refusal := plan.refusal()) is not None:
    raise refusal


def check_distinct_targets(owners: Mapping[str, list[tuple]]) -> None:
  """Target paths of different collections share one NNX namespace, so they
  must not collide. `owners` is `{collection: its target paths}`."""
  names_of: dict[tuple, list[str]] = {}
  for name, paths in owners.items():
    for path in paths:
      names_of.setdefault(path, []).append(name)
  collided = [f'{format_path(p)} ({" and ".join(n)})' for p, n in names_of.items() if len(n) > 1]
  if collided:
    raise StructureError(
        f'variables of different collections map to one path: {format_offenders(collided)}; '
        'map them to distinct paths (paths=...)',
        collided,
    )


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


def check_placement(flat: Flat, mesh: Mesh | None = None, rules: tuple | None = None) -> None:
  """Every placed array sits where its annotation says.

  An array with a `NamedSharding` whose spec is not the one its annotation
  resolves to on that mesh is refused (a relayout would silently reshard it,
  a kept array would carry an annotation that lies).
  """
  wrong = []
  for path, (value, annotation) in flat.items():
    sharding = getattr(value, 'sharding', None)
    if not isinstance(sharding, NamedSharding) or annotation.names is None:
      continue
    where = format_path(path)
    spec = md.resolve(annotation, tuple(value.shape), sharding.mesh, where, rules)
    if not sharding.is_equivalent_to(NamedSharding(sharding.mesh, spec), len(value.shape)):
      wrong.append((where, sharding.spec, spec, annotation.names))
  if wrong:
    listed = [f'{w} is placed as {actual} but its names {names} ask for {wanted}' for w, actual, wanted, names in wrong]
    if len(listed) > _LISTED_PLACEMENTS:
      shown = f'{len(listed)} arrays, e.g. {", ".join(listed[:_LISTED_PLACEMENTS])}'
      if all(actual == PartitionSpec() or all(a is None for a in actual) for _, actual, _, _ in wrong):
        shown += '; all replicated'
    else:
      shown = ', '.join(listed)
    raise AnnotationError(
        f'arrays placed against their annotations: {shown}; the conversion does not '
        "reshard unasked: pass placement='reshard' to put each array where its "
        'annotation says, on its mesh (a model initialised without out_shardings holds '
        "them so; into a target, placement='reshard' is the default, on the target's "
        'mesh), or fix the annotation',
        [w for w, *_ in wrong],
    )


# How many misplaced arrays a refusal lists before it folds the rest.
_LISTED_PLACEMENTS = 3


def _abstract(value) -> bool:
  return isinstance(value, jax.ShapeDtypeStruct)


def check_executable(
    targets: Mapping[tuple, Target], flat: Flat, shardings: Mapping[tuple, NamedSharding | None]
) -> None:
  """Raises `LayoutError` for what the relayout could only fail on part way.

  Every input array must be alive; a relaid target needs a mesh, sources
  that are all arrays or all abstract, and arrays that are on the mesh (or
  not yet placed anywhere).
  """
  deleted = [format_path(p) for p, (v, _) in flat.items() if isinstance(v, jax.Array) and v.is_deleted()]
  if deleted:
    raise StructureError(
        f'these input arrays were deleted (donated to an earlier call?): '
        f'{format_offenders(deleted)}; convert arrays that are still alive',
        deleted,
    )
  problems, offenders = [], []
  for path, t in targets.items():
    if t.kept:
      continue
    values = [flat[s][0] for s in t.sources]
    where = format_path(path)
    if t.annotation.names is None:
      # A bare array reads as replicated; relaid, it would be built so.
      placed = [
          f'{format_path(s)} ({v.sharding.spec})' for s, v in zip(t.sources, values)
          if isinstance(getattr(v, 'sharding', None), NamedSharding) and not v.sharding.is_fully_replicated
      ]
      if placed:
        problems.append(
            f'{where}: bare (unannotated) sources placed sharded, {format_offenders(placed)}, '
            'would be relaid replicated; annotate them with the names of their sharding'
        )
        offenders.append(where)
        continue
    if len({_abstract(v) for v in values}) > 1:
      problems.append(f'{where}: its sources mix arrays and jax.ShapeDtypeStruct')
    elif shardings[path] is None and not _abstract(values[0]):
      # No mesh anywhere: arrays on one device are relaid on that device.
      devices = {d for v in values if isinstance(v, jax.Array) for d in v.devices()}
      if len(devices) <= 1:
        continue
      problems.append(
          f'{where}: its arrays have no NamedSharding and lie on devices '
          f'{sorted(d.id for d in devices)}, and no mesh= was given'
      )
    else:
      stray = [
          format_path(s) for s, v in zip(t.sources, values)
          if isinstance(v, jax.Array) and v.committed and not isinstance(v.sharding, NamedSharding)
      ]
      if stray:
        problems.append(f'{where}: {format_offenders(stray)} live on one device, not on the mesh')
      else:
        continue
    offenders.append(where)
  if problems:
    raise LayoutError(
        f'cannot relayout: {"; ".join(problems)}; put every array on the mesh '
        '(jax.device_put(x, NamedSharding(mesh, spec))) or pass mesh=... for '
        'arrays not yet placed',
        offenders,
    )


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


def _same_mesh(a, b) -> bool:
  if isinstance(a, Mesh) and isinstance(b, Mesh):
    return a == b  # axis names, sizes and device order
  return dict(a.shape) == dict(b.shape) and tuple(a.axis_names) == tuple(b.axis_names)


def check_against_template(path: str, value, annotation, t_value, t_annotation, *, rules=None):
  """The converted leaf fits the target's: shape, dtype, mesh and annotation.

  Annotations agree when they are the same, or when they resolve to the same
  mesh axes (logical names on one side, the mesh axes they resolve to on the
  other; a shorter list of names, trailing dimensions replicated). `rules`
  (the conversion's `rules=`, else the context's) resolves logical names that
  carry no rules, on either side.
  """
  mesh, t_mesh = mesh_of(value), mesh_of(t_value)
  if mesh is not None and t_mesh is not None and not _same_mesh(mesh, t_mesh):
    raise LayoutError(
        f'{path}: the converted array lives on mesh {describe_mesh(mesh)} but the '
        f'target is on mesh {describe_mesh(t_mesh)}; build the target on the same '
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


def check_not_one_sided(plan, mapping: PathMapping, source: Framework, target: Framework) -> None:
  """Refuses target paths that a one-sided rule says only the target's side
  has (a kept path, or an identity mapping, converting onto them): the rule
  keeps the target's value there, so a converted value would be dropped."""
  if source == target:
    return
  clash = [
      f'{format_path(p)} <- {" & ".join(plan.producers[p])}'
      for p in plan.targets if mapping.only(target, p)
  ]
  if clash:
    side = 'NNX' if target == 'nnx' else 'Linen'
    raise PathMappingError(
        f'source paths convert onto paths a one-sided rule says only {side} has: '
        f'{format_offenders(clash)}; the rule keeps the target\'s value there, so the '
        'converted one would be lost',
        clash,
        fix=f'drop the {target}_only rule if the source holds that state, or map the '
        'source path elsewhere',
    )


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
        'one it has, fix the rules (paths=); '
        + ('' if error is OptimizerStateError else
           'for state only the target has (a table the other model computes on the '
           "fly), add PathRule.nnx_only(path) or PathRule.linen_only(path) to keep the "
           "target's value; ")
        + 'else convert between models of the same configuration, optimizer and layout',
    )

