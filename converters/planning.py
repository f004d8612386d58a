"""The plan of a conversion: every target leaf decided, nothing computed.

`plan` takes the flat `{path: (value, Annotation)}` of one framework, matches
every path against a `PathMapping`, and decides each target leaf (a
`Target`): the same array under its new path (same layout), a stack of the
looped layers (loop -> scan, the layer axis name inserted into the
annotation), one slice of a stacked array (scan -> loop, the name removed),
or any of these followed by the rule's value transform. It is pure: it reads
shapes, dtypes and annotations, touches no array, and returns the targets
with the problems found (`Plan.refusal`), which `converters.checks` raises.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from converters import metadata as md
from converters import relayout_ops
from converters.errors import (
    ConversionError,
    LayoutError,
    PathMappingError,
    StructureError,
    format_offenders,
)
from converters.paths import Framework, PathMapping, format_path
from converters.transforms import Step

Flat = Mapping[tuple, tuple[Any, md.Annotation]]


@dataclasses.dataclass(frozen=True)
class Target:
  """How to build one target leaf.

  Attributes:
    op: `Keep` (the source array), `Stack` (the looped sources, in layer
      order) or `Slice` (one layer of the stacked source).
    sources: the source paths the leaf is made from (with a transform that
      fuses parts: every part's, part after part).
    annotation: the target annotation.
    shape, dtype: of the target leaf.
    transform: the rule's value transform, applied after `op`, or None.
  """

  op: relayout_ops.Operation
  sources: tuple[tuple, ...]
  annotation: md.Annotation
  shape: tuple[int, ...]
  dtype: Any
  transform: Step | None = None

  @property
  def kept(self) -> bool:
    """Whether the target leaf is its source array itself (nothing to compute)."""
    return isinstance(self.op, relayout_ops.Keep) and self.transform is None


def _shape_dtype(value) -> tuple[tuple[int, ...], Any]:
  return tuple(value.shape), value.dtype


@dataclasses.dataclass(frozen=True)
class Plan:
  """Every target leaf of one tree, and what stands against building them.

  Attributes:
    targets: `{target path: Target}`.
    producers: `{target path: [source paths, as text]}`: more than one is a
      collision.
    problems: `(message, offenders)` of each leaf that cannot be planned.
  """

  targets: Mapping[tuple, Target]
  producers: Mapping[tuple, tuple[str, ...]]
  problems: tuple[tuple[str, tuple[str, ...]], ...]

  def refusal(self) -> ConversionError | None:
    """The error naming every offender (nested or colliding targets first), or None."""
    nested = [
        f'{format_path(p)} inside {format_path(p[:n])}'
        for p in self.targets for n in range(1, len(p)) if p[:n] in self.targets
    ]
    if nested:
      return PathMappingError(
          f'target paths nest inside other target parameters: {format_offenders(nested)}; '
          'a parameter cannot hold other parameters, so map them to sibling paths',
          nested,
      )
    collisions = {p: srcs for p, srcs in self.producers.items() if len(srcs) > 1}
    if collisions:
      listed = [f"{format_path(p)} <- {' & '.join(sorted(s))}" for p, s in collisions.items()]
      return PathMappingError(
          f'several source paths map to one target path: {format_offenders(listed)}; '
          'make the rules map them to distinct paths',
          listed,
      )
    if self.problems:
      missing = ('missing layers', 'parts of fused parameters are missing')
      messages = [m for m, _ in self.problems]
      error = StructureError if any(m in p for p in messages for m in missing) else LayoutError
      return error('; '.join(messages), [o for _, offenders in self.problems for o in offenders])
    return None


def plan(
    flat: Flat,
    mapping: PathMapping,
    source: Framework,
    target: Framework,
    *,
    scan: bool | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    rules: tuple | None = None,
) -> dict[tuple, Target]:
  """Decides every target leaf of a conversion; raises before touching arrays.

  Args:
    flat: `{source path: (array, annotation)}`.
    mapping: the path rules.
    source, target: the frameworks of `flat` and of the result.
    scan: target layout of layer parameters; `None` keeps each one's layout
      (or takes the one layout its rule has on the target side).
    layer_partition: the layer axis name to insert when stacking.
    num_layers: if given, the number of layers every layer parameter must have.
    rules: the logical rules that tell whether a name a value transform
      merges away shards anything (the conversion's, or the context's).

  Returns:
    The `Plan`: its targets, and the problems that refuse it (`Plan.refusal`).
  """
  planner = _Planner(
      flat=flat, source=source, target=target, scan=scan,
      layer_partition=layer_partition, num_layers=num_layers, rules=rules,
  )
  transformed: dict[tuple, dict[int | None, dict[int, tuple]]] = defaultdict(lambda: defaultdict(dict))
  for path, match in mapping.match(source, flat.keys()).items():
    if match.rule.transform is not None and source != target:
      transformed[match.rule, match.layout][match.index][match.part] = path
    else:
      planner.leaf(path, match)
  planner.check_kept_layers()
  planner.stack_looped_layers()
  for (rule, layout), layers in transformed.items():
    planner.transformed(rule, layout, layers)
  return Plan(
      targets=planner.targets,
      producers={p: tuple(s) for p, s in planner.producers.items()},
      problems=tuple(planner.problems),
  )


@dataclasses.dataclass(kw_only=True)
class _Planner:
  """One plan being decided: its targets, what produces each, and the problems found.

  Every problem is collected, so that the refusal names every offender. It
  lives for one call of `plan`, which hands what it decided to the `Plan`.
  """

  flat: Flat
  source: Framework
  target: Framework
  scan: bool | None
  layer_partition: str | None
  num_layers: int | None
  rules: tuple | None
  targets: dict[tuple, Target] = dataclasses.field(default_factory=dict)
  producers: dict[tuple, list[str]] = dataclasses.field(default_factory=lambda: defaultdict(list))
  problems: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)
  # {(rule, part): {layer: source path}} of looped layers to stack, and to keep
  to_stack: dict = dataclasses.field(default_factory=lambda: defaultdict(dict))
  kept_layers: dict = dataclasses.field(default_factory=lambda: defaultdict(dict))

  def refuse(self, problem: str, offenders) -> None:
    self.problems.append((problem, tuple(offenders)))

  def produce(self, path: tuple, producer: str, target: Target) -> None:
    self.producers[path].append(producer)
    self.targets[path] = target

  def leaf(self, path: tuple, match) -> None:
    """Plans one source leaf whose rule has no value transform."""
    value, annotation = self.flat[path]
    shape, dtype = _shape_dtype(value)
    where, layout, rule = format_path(path), match.layout, match.rule
    want = _wanted_layout(rule, layout, self.target, self.scan)
    if (missing := rule.missing_form(self.target, want)) is not None:
      self.refuse(f'{where}: {missing}', [where])
    elif layout == want:
      length = (shape[:1] or (0,))[0]
      if self.num_layers is not None and layout == 'loop':
        self.kept_layers[rule, match.part][match.index] = path
      elif self.num_layers is not None and layout == 'scan' and length != self.num_layers:
        self.refuse(f'{where}: stacked axis has length {length}, expected num_layers={self.num_layers}', [where])
        return
      new = rule.path(self.target, layout, match.index, match.part)
      self.produce(new, where, Target(relayout_ops.Keep(), (path,), annotation, shape, dtype))
    elif layout == 'loop':  # -> scan
      self.to_stack[rule, match.part][match.index] = path
    else:  # scan -> loop
      self._unstack(path, match, shape, dtype)

  def _unstack(self, path: tuple, match, shape, dtype) -> None:
    where = format_path(path)
    length = shape[0] if shape else 0
    if not length:
      self.refuse(f'{where}: a stacked parameter of shape {shape} has no layers to unstack', [where])
      return
    if self.num_layers is not None and length != self.num_layers:
      self.refuse(f'{where}: stacked axis has length {length}, expected num_layers={self.num_layers}', [where])
      return
    layer_annotation, _ = md.remove_layer_axis(self.flat[path][1], where)
    for i in range(length):
      new = match.rule.path(self.target, 'loop', i, match.part)
      self.produce(new, f'{where}[{i}]', Target(relayout_ops.Slice(i), (path,), layer_annotation, shape[1:], dtype))

  def check_kept_layers(self) -> None:
    for (rule, part), layers in self.kept_layers.items():
      if problem := _layer_count_problem(rule, layers, self.num_layers, self.source, False, part):
        self.refuse(*problem)

  def stack_looped_layers(self) -> None:
    for (rule, part), layers in self.to_stack.items():
      count = self.num_layers if self.num_layers is not None else max(layers) + 1
      if problem := _layer_count_problem(rule, layers, count, self.source, True, part):
        self.refuse(*problem)
        continue
      paths = tuple(layers[i] for i in range(count))
      first_value, first_annotation = self.flat[paths[0]]
      shape, dtype = _shape_dtype(first_value)
      differing = [
          format_path(p)
          for p in paths[1:]
          if _shape_dtype(self.flat[p][0]) != (shape, dtype) or self.flat[p][1] != first_annotation
      ]
      if differing:
        self.refuse(
            f'cannot stack layers whose shape, dtype or annotation differ from '
            f'{format_path(paths[0])} {shape} {dtype}: {format_offenders(differing)}',
            differing,
        )
        continue
      annotation = md.add_layer_axis(first_annotation, self.layer_partition)
      new = rule.path(self.target, 'scan', None, part)
      self.produce(new, format_path(paths[0]) + ' ...', Target(relayout_ops.Stack(), paths, annotation, (count,) + shape, dtype))

  def transformed(self, rule, layout: str, layers: dict[int | None, dict[int, tuple]]) -> None:
    """Plans the target leaves of one rule with a value transform.

    `layers` holds `{layer index: {part: source path}}` (index None outside
    loops). Layout changes compose with the transform: a stack of looped
    layers is transformed with the layer axis leading, a stacked array is
    sliced first.
    """
    parts = len(rule.templates(self.source, layout))  # source arrays per parameter
    want = _wanted_layout(rule, layout, self.target, self.scan)
    if (missing := rule.missing_form(self.target, want)) is not None:
      paths = [format_path(p) for group in layers.values() for p in group.values()]
      self.refuse(f'{format_offenders(paths)}: {missing}', paths)
      return
    incomplete = [
        format_path(rule.path(self.source, layout, index, p))
        for index, group in layers.items() for p in range(parts) if p not in group
    ]
    if incomplete:
      self.refuse(
          f'parts of fused parameters are missing: {format_offenders(incomplete)} '
          f'({rule.template(self.source, layout)!r} lists {parts} parts)',
          incomplete,
      )
      return
    if layout == 'loop' and (want == 'scan' or self.num_layers is not None):
      count = self.num_layers if self.num_layers is not None else max(layers) + 1
      stacking = want == 'scan'
      if problem := _layer_count_problem(rule, {i: g[0] for i, g in layers.items()}, count, self.source, stacking):
        self.refuse(*problem)
        return
    if layout == 'loop' and want == 'scan':
      units = [(None, tuple(layers[i][p] for p in range(parts) for i in range(count)))]
    else:
      units = [(i, tuple(group[p] for p in range(parts))) for i, group in layers.items()]
    for index, sources in units:
      self._transformed_unit(rule, layout, want, index, sources)

  def _transformed_unit(self, rule, layout: str, want: str, index: int | None, sources: tuple) -> None:
    """The target leaves of one transformed parameter: its parts (and layers, to stack)."""
    parts = len(rule.templates(self.source, layout))
    where = format_path(sources[0])
    values = [self.flat[s][0] for s in sources]
    annotations = [self.flat[s][1] for s in sources]
    shape, dtype = _shape_dtype(values[0])
    differing = [
        format_path(s) for s, v, a in zip(sources, values, annotations)
        if _shape_dtype(v) != (shape, dtype) or a != annotations[0]
    ]
    if differing:
      self.refuse(
          f'{rule.template(self.source, layout)!r}: the parts and layers of one transformed '
          f'parameter must share shape, dtype and annotation with {where} {shape} '
          f'{dtype}: {format_offenders(differing)} differ',
          differing,
      )
      return
    annotation, layer_name, lead = annotations[0], None, 0
    if layout == 'scan':
      if not shape or (self.num_layers is not None and shape[0] != self.num_layers):
        layers = self.num_layers if self.num_layers is not None else 'any'
        self.refuse(f'{where}: a stacked parameter of shape {shape} does not have {layers} layers', [where])
        return
      if want == 'loop' and shape[0] == 0:  # nothing to unstack: refused, as untransformed
        self.refuse(f'{where}: a stacked parameter of shape {shape} has no layers to unstack', [where])
        return
      annotation, layer_name = md.remove_layer_axis(annotation, where)
      lead = 1
    rearrange = rule.transform
    part_count = max(parts, rule.parts(self.target))  # the part axis's size
    sizes = rearrange.axis_sizes(self.source, [shape[lead:]] * parts, 0, part_count, where)
    sharded = _sharded_test(annotation, self.rules, where)
    names = rearrange.target_names(self.source, annotation.names, sharded, where)
    annotation = dataclasses.replace(annotation, names=names)
    target_shape = rearrange.target_shape(self.target, sizes)
    if layout == 'scan' and want == 'scan':
      op, step_lead = relayout_ops.Keep(), 1
      annotation = md.add_layer_axis(annotation, layer_name)
      target_shape = shape[:1] + target_shape
    elif layout == 'scan':
      op, step_lead = None, 0  # a `Slice` per layer
    elif want == 'scan':
      op, step_lead = relayout_ops.Stack(), 1
      annotation = md.add_layer_axis(annotation, self.layer_partition)
      target_shape = (len(sources) // parts,) + target_shape
    else:
      op, step_lead = relayout_ops.Keep(), 0
    for part in range(rearrange.target_parts(self.target, sizes)):
      step = Step(rearrange, self.source, step_lead, part, part_count)
      if op is None:
        for i in range(shape[0]):
          new = rule.path(self.target, 'loop', i, part)
          self.produce(new, f'{where}[{i}]', Target(relayout_ops.Slice(i), sources, annotation, target_shape, dtype, step))
      else:
        new = rule.path(self.target, want, index, part)
        producer = where + (' ...' if isinstance(op, relayout_ops.Stack) else '')
        self.produce(new, producer, Target(op, sources, annotation, target_shape, dtype, step))


def _wanted_layout(rule, layout: str, target: Framework, scan: bool | None) -> str:
  """The target layout of a parameter in `layout`: as `scan` asks; with None,
  its own, unless its rule's target side has only the other (a port that
  loops what the original scans)."""
  if layout == 'plain':
    return layout
  if scan is not None:
    return 'scan' if scan else 'loop'
  if rule.templates(target, layout) is None:
    return 'loop' if layout == 'scan' else 'scan'
  return layout


def _sharded_test(annotation: md.Annotation, rules: tuple | None, where: str):
  """Whether a name of `annotation` puts its dimension on a mesh axis."""
  def is_sharded(name) -> bool:
    if not annotation.logical:
      return True
    single = dataclasses.replace(annotation, names=(name,))
    return md.mesh_axes(single, where, rules)[0] is not None
  return is_sharded


def _layer_count_problem(
    rule, layers: dict[int, tuple], count: int, source: Framework, stacking: bool, part: int = 0
):
  """`(message, offenders)` when `layers` are not exactly layers 0..count-1
  (`stacking`: to stack them, else to keep them as layers).

  Costs the number of layers present, not `count` (which a caller may give
  as any number): at most 50 missing layers are named.
  """
  present = sum(1 for i in layers if i < count)
  missing, i = [], 0
  while len(missing) < min(50, count - present):
    if i not in layers:
      missing.append(rule.path(source, 'loop', i, part))
    i += 1
  extra = [p for i, p in layers.items() if i >= count]
  if not (missing or extra):
    return None
  missing_text = ', '.join(format_path(p) for p in missing)
  if count - present > len(missing):
    missing_text += f', ... ({count - present - len(missing)} more)'
  extra_text = format_offenders(format_path(p) for p in extra)
  what = 'cannot stack' if stacking else 'layers of'
  return (
      f'{what} {rule.template(source, "loop")!r}: missing layers [{missing_text}], '
      f'layers beyond num_layers={count} [{extra_text}]',
      [format_path(p) for p in missing + extra],
  )
