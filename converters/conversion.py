"""One input's conversion: every tree planned and checked, then every array built.

`Conversion.add` takes a flat tree of one framework through the pipeline's
first stages: state only the source's side has left out (a one-sided
`PathRule`), agreement between processes, placement, the plan
(`converters.planning`) and every check of it (`converters.checks`). It
returns each target leaf: the input array where its layout is kept, a
`Pending` one where it changes. The caller checks those against its target
(`converters.filling`); `run` then builds every pending array
(`converters.execution`), deleting donated sources, so a check that fails
late leaves the input whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax

from converters import checks, execution, planning, sharding
from converters import metadata as md
from converters.errors import PathMappingError, format_offenders
from converters.options import Options
from converters.paths import Framework, PathMapping, format_path

#: `{target path: (array or Pending, annotation)}` of one tree.
Planned = dict[tuple, tuple[Any, md.Annotation]]


class Pending:
  """A target array that `Conversion.run` has yet to build: its shape, dtype and sharding."""

  def __init__(self, shape: tuple[int, ...], dtype, sharding):
    self.shape, self.dtype, self.sharding = tuple(shape), dtype, sharding

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def __repr__(self) -> str:
    return f'Pending({self.shape}, {self.dtype}, {self.sharding})'


class Conversion:
  """The trees of one input, all planned and checked before any array is built.

  A buffer that two input leaves share (tied weights, an array passed twice,
  a scalar passed through) is never deleted.
  """

  def __init__(self, options: Options):
    checks.check_layer_rules(options)
    self.options = options
    self._jobs: list[tuple] = []
    self._inputs: list[Any] = []
    self._built: dict[int, Any] = {}

  def add(self, flat, source: Framework, target: Framework) -> Planned:
    """Plans and checks one flat tree; raises before anything is built."""
    options = self.options
    # State only the source's side has (a one-sided rule names it) is left out.
    pairs = {
        p: (v[0], v[1]) for p, v in flat.items()
        if source == target or not options.paths.only(source, p)
    }
    if jax.process_count() > 1:
      checks.agree_on_conversion(pairs, source, target, options)
    if options.placement == 'reshard':  # placed as the annotations say: nothing to check
      pairs = sharding.place_inputs(
          pairs, sharding.placement_mesh(options.mesh), options.resolution_rules,
          unplaced_stay=options.unplaced_stay,
      )
    else:
      checks.check_placement(pairs, options.mesh, options.resolution_rules)
    plan = planning.plan(
        pairs, options.paths, source, target, scan=options.scan,
        layer_partition=options.layer_partition, num_layers=options.num_layers,
        rules=options.resolution_rules,
    )
    checks.check_plan(plan)
    checks.check_not_one_sided(plan, options.paths, source, target)
    targets = plan.targets
    if options.rules is not None:
      targets = {
          p: dataclasses.replace(t, annotation=md.with_default_rules(t.annotation, options.rules))
          for p, t in targets.items()
      }
    shardings = sharding.target_shardings(targets, pairs, options.mesh, options.resolution_rules)
    checks.check_executable(targets, pairs, shardings)
    for path, t in targets.items():
      checks.check_writable(format_path(path), t.shape, t.dtype, t.annotation, target)
    planned = {
        path: (
            pairs[t.sources[0]][0] if t.kept else Pending(t.shape, t.dtype, shardings[path]),
            t.annotation,
        )
        for path, t in targets.items()
    }
    self._inputs.extend(v for v, _ in pairs.values())
    self._jobs.append((targets, pairs, shardings, planned))
    return planned

  def add_collections(
      self,
      flats: Mapping[str, Any],
      source: Framework,
      target: Framework,
      *,
      target_paths: Callable[[], Iterable[tuple]] | None = None,
      target_leaves: Callable[[], Mapping[tuple, tuple]] | None = None,
  ) -> dict[str, Planned]:
    """`add` of every collection, whose target paths must be distinct.

    `target_paths`, when given, lists the paths of the target's parameters:
    a refusal for source paths no rule maps then also names the target's.
    `target_leaves`, when given, gives `{path: shape}` of every variable of
    the target: the mapping is bound to it (a loop's length, for rules
    counted after it: `Dense_{n}`), else to every collection of the source.
    """
    self.bind(flats, source, target, target_leaves)
    try:
      planned = {name: self.add(flat, source, target) for name, flat in flats.items()}
    except PathMappingError as e:
      if target_paths is None:
        raise
      raise _with_target_side(e, self.options.paths, target, target_paths()) from None
    checks.check_distinct_targets({name: list(tree) for name, tree in planned.items()})
    return planned

  def bind(self, flats: Mapping[str, Any], source: Framework, target: Framework,
           target_leaves: Callable[[], Mapping[tuple, tuple]] | None = None) -> None:
    """The conversion's mapping bound to one model for all its collections
    (and the optimizer state converted after them): to the target's
    variables where known, else to the source's."""
    if self.options.paths.is_bound:
      return
    if target_leaves is not None and source != target:
      paths = self.options.paths.bound(target, target_leaves())
    else:
      paths = self.options.paths.bound(
          source, {p: getattr(v[0], 'shape', ()) for flat in flats.values() for p, v in flat.items()})
    self.options = dataclasses.replace(self.options, paths=paths)

  def protect(self, values: Iterable[Any]) -> None:
    """Input arrays used outside the planned trees (steps, counts): never deleted."""
    self._inputs.extend(values)

  def run(self) -> None:
    """Builds every pending array of every tree added."""
    shared = execution.shared_buffers(self._inputs)
    for targets, pairs, shardings, planned in self._jobs:
      arrays = execution.execute(
          targets, pairs, shardings, donate=self.options.donate, shared=shared
      )
      for path, (value, _) in planned.items():
        if isinstance(value, Pending):
          self._built[id(value)] = arrays[path]
    self._jobs = []

  def value(self, value):
    """The array a planned value stands for (after `run`)."""
    return self._built[id(value)] if isinstance(value, Pending) else value


def _with_target_side(
    error: PathMappingError, mapping: PathMapping, framework: Framework, target_paths
) -> PathMappingError:
  """`error` (source paths no rule maps) with the target's `framework` paths
  that no rule maps either, so that both sides of a missing rule are named."""
  unmapped = [format_path(p) for p in target_paths if not mapping.match_all(framework, p)]
  if not unmapped:
    return error
  return PathMappingError(
      f'{error.problem}; and no rule maps these {framework} paths of the target: '
      f'{format_offenders(unmapped)}',
      error.paths + tuple(unmapped),
      fix=error.fix,
  )
