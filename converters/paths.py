"""A declarative, reversible mapping between Linen and NNX parameter paths.

A `PathRule` pairs a Linen path template with an NNX one, for looped layers
(`{i}` marks the layer index) and, optionally, for the same parameter stacked by
a scan (no `{i}`: the layer index became axis 0 of the array). Rules without
`{i}` map one parameter outside the layers. A `PathMapping` is a list of rules;
`match` tells which rule, layout and layer index a path has, in either
framework, so one mapping serves Linen -> NNX, NNX -> Linen and scan <-> loop.

Paths are relative to the parameters' root: Linen paths start below the
`params` collection (`Block_0/Dense_0/kernel`), NNX paths at the model
(`blocks/0/linear/kernel`). Mappings of published models are in
`converters.presets`; extend any mapping with `mapping + [PathRule(...)]`.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from collections.abc import Iterable, Sequence
from typing import Literal

from converters.errors import PathMappingError, format_offenders

Framework = Literal['linen', 'nnx']
Layout = Literal['loop', 'scan', 'plain']
_INDEX = '{i}'


def _key_text(key) -> str:
  text = str(key)
  return repr(text) if '/' in text else text


def format_path(path: Sequence) -> str:
  """`a/b/0`; a key that itself contains `/` is quoted (`a/'b/c'`), so two
  different paths never read the same."""
  return '/'.join(_key_text(k) for k in path)



def parse_path(text: str, framework: Framework) -> tuple:
  """NNX paths index lists with ints; Linen paths are all strings."""
  keys = text.split('/')
  if framework == 'nnx':
    return tuple(int(k) if k.isdigit() else k for k in keys)
  return tuple(keys)


@dataclasses.dataclass(frozen=True)
class PathRule:
  """One parameter's path in Linen and in NNX.

  Attributes:
    linen: Linen template; `{i}` marks the layer index of looped layers.
    nnx: NNX template; `{i}` if and only if `linen` has it.
    linen_stacked: Linen path of the same parameter stacked over layers by
      `nn.scan` (layer rules only; `None` if no scanned form).
    nnx_stacked: NNX path of the stacked parameter (`nnx.vmap`/`nnx.scan`).
  """

  linen: str
  nnx: str
  linen_stacked: str | None = None
  nnx_stacked: str | None = None

  def __post_init__(self):
    layered = [_INDEX in t for t in (self.linen, self.nnx)]
    if layered[0] != layered[1] or any(t.count(_INDEX) > 1 for t in (self.linen, self.nnx)):
      raise PathMappingError(
          f'rule {self}: put {_INDEX} exactly once in both templates (a layer '
          'parameter) or in neither (a parameter outside the layers)'
      )
    stacked = (self.linen_stacked, self.nnx_stacked)
    if (stacked[0] is None) != (stacked[1] is None):
      raise PathMappingError(
          f'rule {self}: give both linen_stacked and nnx_stacked, or neither'
      )
    if stacked[0] is not None and (not self.layered or any(_INDEX in t for t in stacked)):
      raise PathMappingError(
          f'rule {self}: stacked templates belong to layer rules and have no '
          f'{_INDEX} (the layer index is axis 0 of the stacked array)'
      )

  @property
  def layered(self) -> bool:
    return _INDEX in self.linen

  def template(self, framework: Framework, layout: Layout) -> str | None:
    if layout == 'scan':
      return self.linen_stacked if framework == 'linen' else self.nnx_stacked
    return self.linen if framework == 'linen' else self.nnx

  def layouts(self) -> tuple[Layout, ...]:
    if not self.layered:
      return ('plain',)
    return ('loop', 'scan') if self.linen_stacked is not None else ('loop',)

  def path(self, framework: Framework, layout: Layout, index: int | None) -> tuple:
    template = self.template(framework, layout)
    if template is None:
      raise PathMappingError(
          f'rule {self} has no stacked form; add linen_stacked and nnx_stacked '
          'to convert it to a scanned layout'
      )
    text = template.replace(_INDEX, str(index)) if layout == 'loop' else template
    return parse_path(text, framework)


def _compile(template: str) -> re.Pattern:
  pattern = re.escape(template).replace(re.escape(_INDEX), r'(?P<i>0|[1-9]\d*)')
  return re.compile(pattern + r'\Z')


@dataclasses.dataclass(frozen=True)
class Match:
  """What a path is: which rule, in which layout, for which layer."""

  rule: PathRule
  layout: Layout
  index: int | None


class PathMapping:
  """An ordered set of `PathRule`s; every path must match exactly one."""

  def __init__(self, rules: Iterable[PathRule]):
    self.rules = tuple(rules)
    self._patterns = [
        (rule, layout, fw, _compile(rule.template(fw, layout)))
        for rule in self.rules
        for layout in rule.layouts()
        for fw in ('linen', 'nnx')
    ]
    seen: dict[tuple, PathRule] = {}
    duplicates = []
    for rule, layout, fw, pattern in self._patterns:
      key = (fw, pattern.pattern)
      if key in seen and seen[key] is not rule:
        duplicates.append(f'{fw} {rule.template(fw, layout)!r}')
      seen[key] = rule
    if duplicates:
      raise PathMappingError(
          'several rules share a template, so their paths are ambiguous: '
          f'{format_offenders(duplicates)}; keep one rule per template',
          duplicates,
      )

  def __add__(self, rules: Iterable[PathRule]) -> PathMapping:
    return PathMapping(self.rules + tuple(rules))

  def __repr__(self) -> str:
    return f'PathMapping({list(self.rules)!r})'

  def match_all(self, framework: Framework, path: Sequence) -> list[Match]:
    text = format_path(path)
    found = []
    for rule, layout, fw, pattern in self._patterns:
      if fw == framework and (m := pattern.match(text)):
        found.append(Match(rule, layout, int(m['i']) if layout == 'loop' else None))
    return found

  def match(self, framework: Framework, paths: Iterable[Sequence]) -> dict[tuple, Match]:
    """The one `Match` of every path; raises listing every unmapped or ambiguous path."""
    result, unmapped, ambiguous = {}, [], []
    for path in paths:
      found = self.match_all(framework, path)
      if not found:
        unmapped.append(format_path(path))
      elif len(found) > 1:
        ambiguous.append(
            f'{format_path(path)} (rules: '
            + '; '.join(repr(m.rule.template(framework, m.layout)) for m in found)
            + ')'
        )
      else:
        result[tuple(path)] = found[0]
    problems = []
    if unmapped:
      problems.append(
          f'no rule maps these {framework} paths: {format_offenders(unmapped)}; '
          'add a PathRule for each (mapping + [PathRule(linen=..., nnx=...)])'
      )
    if ambiguous:
      problems.append(
          f'several rules map these {framework} paths: '
          f'{format_offenders(ambiguous)}; make the templates disjoint'
      )
    if problems:
      raise PathMappingError('; '.join(problems), unmapped + ambiguous)
    return result


def as_mapping(paths) -> PathMapping:
  """A `PathMapping`, or any iterable of `PathRule`s made into one."""
  if isinstance(paths, PathMapping):
    return paths
  if isinstance(paths, (str, bytes)) or not isinstance(paths, Iterable):
    raise PathMappingError(
        f'paths={paths!r}: pass a PathMapping or an iterable of PathRule '
        '(e.g. GUIDE_PATHS + [PathRule(linen=..., nnx=...)])'
    )
  rules = list(paths)
  wrong = [repr(r) for r in rules if not isinstance(r, PathRule)]
  if wrong:
    raise PathMappingError(
        f'paths holds {format_offenders(wrong)}, which are not PathRules; '
        'write each as PathRule(linen=..., nnx=...)',
        wrong,
    )
  return PathMapping(rules)


_MOVED_TO_PRESETS = ('GUIDE_PATHS', 'GUIDE_LOGICAL_PATHS', 'KIT_PATHS')


def __getattr__(name):
  if name in _MOVED_TO_PRESETS:
    warnings.warn(
        f'converters.paths.{name} moved to converters.presets.{name} (also '
        f'converters.{name}); import it from there',
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module('converters.presets'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
