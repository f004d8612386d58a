"""Path translation and scan <-> loop relayout of flat parameter trees.

`plan` takes the flat `{path: (value, Annotation)}` of one framework, matches
every path against a `PathMapping`, and decides each target leaf: the same
array under its new path (same layout), a stack of the looped layers (loop ->
scan, the layer axis name inserted into the annotation) or one slice of a
stacked array (scan -> loop, the name removed). It checks everything before
any array is touched, and raises listing every offender.

`execute` carries the plan out. Leaves whose layout does not change are the
input arrays themselves: no data is copied. Stacks and slices run on device in
one `jax.jit` whose `out_shardings` come from the target annotations, so they
never pass through the host and work on arrays that are not fully addressable;
or, donating the sources, one jit per group of layers, each group's sources
deleted as soon as its results exist.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from converters import metadata as md
from converters import provenance
from converters.allocator import release_free_memory
from converters.errors import (
    AnnotationError,
    LayoutError,
    PathMappingError,
    ShapeError,
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
    op: 'keep' (the source array), 'stack' (the looped sources, in layer
      order) or 'slice' (layer `index` of the one stacked source).
    sources: the source paths the leaf is made from (with a transform that
      fuses parts: every part's, part after part).
    annotation: the target annotation.
    shape, dtype: of the target leaf.
    index: the layer of a 'slice'.
    transform: the rule's value transform, applied after `op`, or None.
  """

  op: str
  sources: tuple[tuple, ...]
  annotation: md.Annotation
  shape: tuple[int, ...]
  dtype: Any
  index: int | None = None
  transform: Step | None = None

  @property
  def kept(self) -> bool:
    """Whether the target leaf is its source array itself (nothing to compute)."""
    return self.op == 'keep' and self.transform is None


def _shape_dtype(value) -> tuple[tuple[int, ...], Any]:
  return tuple(value.shape), value.dtype


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

  Raises:
    ConversionError: naming every offending path (nothing is computed).
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
  return planner.targets_or_raise()


@dataclasses.dataclass(kw_only=True)
class _Planner:
  """One plan being decided: its targets, what produces each, and the problems found.

  Every problem is collected, so that the refusal names every offender.
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
  problems: list[str] = dataclasses.field(default_factory=list)
  offenders: list[str] = dataclasses.field(default_factory=list)
  # {(rule, part): {layer: source path}} of looped layers to stack, and to keep
  to_stack: dict = dataclasses.field(default_factory=lambda: defaultdict(dict))
  kept_layers: dict = dataclasses.field(default_factory=lambda: defaultdict(dict))

  def refuse(self, problem: str, offenders) -> None:
    self.problems.append(problem)
    self.offenders.extend(offenders)

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
      self.produce(new, where, Target('keep', (path,), annotation, shape, dtype))
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
      self.produce(new, f'{where}[{i}]', Target('slice', (path,), layer_annotation, shape[1:], dtype, i))

  def check_kept_layers(self) -> None:
    for (rule, part), layers in self.kept_layers.items():
      if problem := _layer_count_problem(rule, layers, self.num_layers, self.source, 'keep', part):
        self.refuse(*problem)

  def stack_looped_layers(self) -> None:
    for (rule, part), layers in self.to_stack.items():
      count = self.num_layers if self.num_layers is not None else max(layers) + 1
      if problem := _layer_count_problem(rule, layers, count, self.source, 'stack', part):
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
      self.produce(new, format_path(paths[0]) + ' ...', Target('stack', paths, annotation, (count,) + shape, dtype))

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
      verb = 'stack' if want == 'scan' else 'keep'
      if problem := _layer_count_problem(rule, {i: g[0] for i, g in layers.items()}, count, self.source, verb):
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
      op, step_lead = 'keep', 1
      annotation = md.add_layer_axis(annotation, layer_name)
      target_shape = shape[:1] + target_shape
    elif layout == 'scan':
      op, step_lead = 'slice', 0
    elif want == 'scan':
      op, step_lead = 'stack', 1
      annotation = md.add_layer_axis(annotation, self.layer_partition)
      target_shape = (len(sources) // parts,) + target_shape
    else:
      op, step_lead = 'keep', 0
    for part in range(rearrange.target_parts(self.target, sizes)):
      step = Step(rearrange, self.source, step_lead, part, part_count)
      if op == 'slice':
        for i in range(shape[0]):
          new = rule.path(self.target, 'loop', i, part)
          self.produce(new, f'{where}[{i}]', Target('slice', sources, annotation, target_shape, dtype, i, step))
      else:
        new = rule.path(self.target, want, index, part)
        producer = where + (' ...' if op == 'stack' else '')
        self.produce(new, producer, Target(op, sources, annotation, target_shape, dtype, None, step))

  def targets_or_raise(self) -> dict[tuple, Target]:
    """The plan's targets, or the refusal naming every offender."""
    nested = [
        f'{format_path(p)} inside {format_path(p[:n])}'
        for p in self.targets for n in range(1, len(p)) if p[:n] in self.targets
    ]
    if nested:
      raise PathMappingError(
          f'target paths nest inside other target parameters: {format_offenders(nested)}; '
          'a parameter cannot hold other parameters, so map them to sibling paths',
          nested,
      )
    collisions = {p: srcs for p, srcs in self.producers.items() if len(srcs) > 1}
    if collisions:
      listed = [f"{format_path(p)} <- {' & '.join(sorted(s))}" for p, s in collisions.items()]
      raise PathMappingError(
          f'several source paths map to one target path: {format_offenders(listed)}; '
          'make the rules map them to distinct paths',
          listed,
      )
    if self.problems:
      missing = ('missing layers', 'parts of fused parameters are missing')
      error = StructureError if any(m in p for p in self.problems for m in missing) else LayoutError
      raise error('; '.join(self.problems), self.offenders)
    return self.targets


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
    rule, layers: dict[int, tuple], count: int, source: Framework, verb: str, part: int = 0
):
  """`(message, offenders)` when `layers` are not exactly layers 0..count-1.

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
  what = 'cannot stack' if verb == 'stack' else 'layers of'
  return (
      f'{what} {rule.template(source, "loop")!r}: missing layers [{missing_text}], '
      f'layers beyond num_layers={count} [{extra_text}]',
      [format_path(p) for p in missing + extra],
  )


def _mesh_of(value, annotation: md.Annotation, mesh: Mesh | None) -> Mesh | None:
  sharding = getattr(value, 'sharding', None)
  if isinstance(sharding, NamedSharding):
    return sharding.mesh
  return annotation.mesh or mesh


def describe_mesh(mesh) -> str:
  """`{'data': 2, 'model': 4} on devices [...]` (no devices for an abstract mesh)."""
  devices = f' on devices {[d.id for d in mesh.devices.flat]}' if isinstance(mesh, Mesh) else ''
  return f'{dict(mesh.shape)}{devices}'


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
    raise AnnotationError(
        f'arrays placed against their annotations: {format_offenders(listed)}; '
        'the converters check placement rather than reshard silently: put each '
        'array where its annotation says (jax.device_put(x, NamedSharding(mesh, '
        'spec))) or fix the annotation',
        [w for w, *_ in wrong],
    )


def target_shardings(
    targets: Mapping[tuple, Target],
    flat: Flat,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
) -> dict[tuple, NamedSharding | None]:
  """Checks every target annotation on its mesh; the `NamedSharding` each asks for.

  The sources of one target (a stack's layers) must live on one mesh.
  """
  shardings = {}
  for path, t in targets.items():
    meshes = {}
    for source_path in t.sources:
      value, annotation = flat[source_path]
      leaf_mesh = _mesh_of(value, annotation, mesh)
      if leaf_mesh is not None:
        meshes.setdefault(leaf_mesh, format_path(source_path))
    if len(meshes) > 1:
      listed = [f'{p} on {describe_mesh(m)}' for m, p in meshes.items()]
      raise LayoutError(
          f'{format_path(path)}: its sources live on different meshes or device '
          f'orders ({format_offenders(listed)}); put every layer on one mesh '
          '(jax.device_put) before converting',
          list(meshes.values()),
      )
    leaf_mesh = next(iter(meshes), None)
    try:
      spec = md.resolve(t.annotation, t.shape, leaf_mesh, format_path(path), rules)
    except AnnotationError as e:
      if t.transform is None:
        raise
      raise AnnotationError(
          f'{e} ({format_path(path)} is made from {format_path(t.sources[0])} by '
          f'{t.transform.rearrange!r}, and the sharding cannot follow it: give sizes '
          'the mesh divides, or convert with that name resolving to None (rules=...) '
          'and reshard after)',
          e.paths,
      ) from e
    shardings[path] = None if leaf_mesh is None else NamedSharding(leaf_mesh, spec)
  return shardings


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


def buffer_keys(value) -> frozenset:
  """What identifies the device buffers of an array: (device, address) of each shard."""
  if not isinstance(value, jax.Array) or value.is_deleted():
    return frozenset()
  try:
    return frozenset(
        (shard.device.id, shard.data.unsafe_buffer_pointer()) for shard in value.addressable_shards
    )
  except Exception:  # a backend without raw pointers: the array itself stands for them
    return frozenset({('array', id(value))})


def _relayout(recipe, *arrays):
  results = []
  for op, inputs, index, transform in recipe:
    parts = 1 if transform is None else transform.source_arrays
    if op == 'stack':  # part after part, each a run of layers
      layers = len(inputs) // parts
      values = [
          jnp.stack([arrays[i] for i in inputs[p * layers:(p + 1) * layers]]) for p in range(parts)
      ]
    elif op == 'slice':
      values = [arrays[i][index] for i in inputs]
    else:
      values = [arrays[i] for i in inputs]
    results.append(values[0] if transform is None else transform(values))
  return results


@functools.lru_cache(maxsize=64)
def _compiled_relayout(recipe: tuple, out_shardings: tuple):
  """One jitted relayout per recipe and target shardings, reused across calls."""
  return jax.jit(
      functools.partial(_relayout, recipe), out_shardings=list(out_shardings)
  )


def _groups(moved: list[tuple], targets: Mapping[tuple, Target]) -> list[list[tuple]]:
  """`moved` split so no two groups read the same source: a stack with its
  layers, or every slice of one stacked array."""
  groups: dict[tuple, list[tuple]] = defaultdict(list)
  for p in moved:
    groups[targets[p].sources].append(p)
  return list(groups.values())


def _run(
    paths: list[tuple],
    targets: Mapping[tuple, Target],
    flat: Flat,
    shardings: Mapping[tuple, NamedSharding | None],
) -> list[Any]:
  sources = sorted({s for p in paths for s in targets[p].sources}, key=format_path)
  position = {s: i for i, s in enumerate(sources)}
  recipe = tuple(
      (
          targets[p].op, tuple(position[s] for s in targets[p].sources), targets[p].index,
          targets[p].transform,
      )
      for p in paths
  )
  relayout = _compiled_relayout(recipe, tuple(shardings[p] for p in paths))
  return relayout(*[flat[s][0] for s in sources])


def execute(
    targets: Mapping[tuple, Target],
    flat: Flat,
    shardings: Mapping[tuple, NamedSharding | None],
    donate: bool = False,
    shared: frozenset = frozenset(),
) -> dict[tuple, Any]:
  """The target arrays: inputs themselves where kept, one jit for the rest.

  With `donate`, the relayout runs one group of layers at a time and deletes
  each group's source arrays once its results exist, so it holds one group
  twice instead of every moved array. A source whose buffers are in `shared`
  (used by another input leaf), or are also a kept output, is never deleted.
  Call `check_executable` first (`tree_io.Batch.plan` does).
  """
  out: dict[tuple, Any] = {}
  moved = []
  for path, t in targets.items():
    if t.kept:
      out[path] = flat[t.sources[0]][0]
    elif _abstract(flat[t.sources[0]][0]):
      out[path] = provenance.record(
          jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=shardings[path]),
          provenance.Derivation(
              t.op, tuple(flat[s][0] for s in t.sources), t.index, t.transform
          ),
      )
    else:
      moved.append(path)
  if not moved:
    return out
  kept = set(shared)
  for value in out.values():
    kept |= buffer_keys(value)
  if donate:
    batches = _groups(moved, targets)
  else:  # arrays on a mesh, and arrays outside any mesh (by device), compile apart
    by_place: dict[Any, list[tuple]] = defaultdict(list)
    for p in moved:
      value = flat[targets[p].sources[0]][0]
      device = next(iter(value.devices())) if isinstance(value, jax.Array) else None
      by_place['mesh' if shardings[p] is not None else device].append(p)
    batches = list(by_place.values())
  for group in batches:
    results = _run(group, targets, flat, shardings)
    if donate:  # one group at a time: the next starts once these sources are freed
      jax.block_until_ready(results)
    for path, result in zip(group, results):
      if result.shape != targets[path].shape:  # a broken plan, not bad input
        raise ShapeError(f'{format_path(path)}: relayout gave {result.shape}')
      out[path] = result
    if donate:
      for source in {s for p in group for s in targets[p].sources}:
        value = flat[source][0]
        buffers = buffer_keys(value)
        if buffers and not buffers & kept:
          value.delete()
      # Layer-sized buffers are kept by the C allocator, not reused for the
      # larger stacks: give them back before the next group.
      release_free_memory()
  return out
