"""A declarative, reversible mapping between Linen and NNX parameter paths.

A `PathRule` pairs a Linen path template with an NNX one, for looped layers
(`{i}` marks the layer index) and, optionally, for the same parameter stacked by
a scan (no `{i}`: the layer index became axis 0 of the array). Rules without
`{i}` map one parameter outside the layers. A `PathMapping` is a list of rules;
`match` tells which rule, layout and layer index a path has, in either
framework, so one mapping serves Linen -> NNX, NNX -> Linen and scan <-> loop.
A mapping made with `keep_unmatched=True` (`PathMapping.identity()` has no
rules at all) maps every path no rule matches to the same path, for ports
that kept most names. A rule with a `transform` (`converters.transforms.
Rearrange`) also changes the parameter's shape; a fused parameter's rule
lists one template per part on the side that keeps the parts apart. A one-sided
rule names state only one side has (`PathRule.nnx_only('decoder/pos_table')`:
a table the NNX port holds and Linen computes on the fly): converting into
that side keeps the target's own value, and converting from it leaves the
state out.

Linen numbers the layers of one class in the order it creates them, so a
layer made after a loop's (`Dense_{n}` for `n` looped `Dense`s, the MLP's
head) has a number that moves with the loop's length: its rule counts
(`PathRule('Dense_{n}/kernel', 'head/kernel')`, `Dense_{n+1}` for the one
after), against the loop's rule of the same key (`'Dense_{i}/kernel'`). A
mapping with counted rules is bound to the paths of one model
(`PathMapping.bound`), which `match` does itself.

Paths are relative to the parameters' root: Linen paths start below the
`params` collection (`Block_0/Dense_0/kernel`), NNX paths at the model
(`blocks/0/linear/kernel`). Mappings of published models are in
`converters.presets`; extend any mapping with `mapping + [PathRule(...)]`.
`resolve` says what `paths=None`, the conversions' default, means.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from converters.errors import PathMappingError, format_offenders
from converters.transforms import Rearrange

Framework = Literal['linen', 'nnx']
Layout = Literal['loop', 'scan', 'plain']
_INDEX = '{i}'
#: The layer index in a template: `{i}`, or `{i+1}` on a side that numbers
#: the loop's first layer 1 (a Linen `Dense_0` made before the loop's).
_INDEX_TOKEN = re.compile(r'\{i(?:\+(?P<offset>[1-9]\d*))?\}')
#: Every `{...}` a template may hold.
_VALID_TOKEN = re.compile(r'\{[in](?:\+[1-9]\d*)?\}')
#: A Linen key numbered after a loop's layers: `Dense_{n}`, `Dense_{n+1}`.
_COUNTED_KEY = re.compile(r'(?P<name>.+)_\{n(?:\+(?P<after>[1-9]\d*))?\}\Z')
_SIDE_NAMES = {'linen': 'Linen', 'nnx': 'NNX'}
#: How to fix paths that no rule maps.
UNMAPPED_FIX = 'add a PathRule for each (mapping + [PathRule(linen=..., nnx=...)])'


_QUOTED_START = ("'", '"', '(')


def _key_text(key) -> str:
  """A key as path text: itself, or its Python literal when it holds `/`,
  opens with a quote or parenthesis, or is a tuple (Flax `SpectralNorm`'s
  `('kernel', 'u')`)."""
  if isinstance(key, tuple):
    return repr(key)
  text = str(key)
  return repr(text) if '/' in text or text.startswith(_QUOTED_START) else text


def format_path(path: Sequence) -> str:
  """`a/b/0`; a key that itself contains `/` is quoted (`a/'b/c'`) and a
  tuple key written as its literal (`sn/batch_stats/('kernel', 'u')`), so
  two different paths never read the same and `parse_path` reads it back."""
  return '/'.join(_key_text(k) for k in path)


def _literal_key(text: str, keys: list[str]) -> object:
  """The quoted or tuple key that opens `text`, taking as many following
  `/`-separated pieces of `keys` as its literal spans (consumed)."""
  while True:
    try:
      key = ast.literal_eval(text)
    except (SyntaxError, ValueError):
      key = None
    if isinstance(key, (str, tuple)):  # () too: an empty tuple key
      return key
    if not keys:
      raise PathMappingError(
          f'path key {text!r} opens a quoted or tuple key that never closes; write a '
          "key holding '/' as a Python string literal ('a/b') and a tuple key as its "
          "literal (('kernel', 'u'))"
      )
    text += '/' + keys.pop(0)


def parse_path(text: str, framework: Framework) -> tuple:
  """The path `format_path` wrote: NNX paths index lists with ints; Linen
  paths are all strings; quoted and tuple keys are read as literals."""
  pieces, keys = text.split('/'), []
  while pieces:
    piece = pieces.pop(0)
    if piece.startswith(_QUOTED_START):
      keys.append(_literal_key(piece, pieces))
    elif framework == 'nnx' and piece.isascii() and piece.isdigit():
      keys.append(int(piece))
    else:
      keys.append(piece)
  return tuple(keys)


Templates = str | tuple[str, ...]


def _normal_template(template: str, framework: Framework) -> str:
  """`template` as `format_path` writes the path it names (a quoted or tuple
  key in one spelling), so that it matches the paths it is meant to."""
  return format_path(parse_path(template, framework))


def _as_templates(value) -> tuple[str, ...] | None:
  if value is None:
    return None
  return (value,) if isinstance(value, str) else tuple(value)


@dataclasses.dataclass(frozen=True)
class PathRule:
  """One parameter's path in Linen and in NNX.

  Attributes:
    linen: Linen template; `{i}` marks the layer index of looped layers.
      None for a layer parameter the Linen model only has stacked (a Linen
      model that scans, beside a port that loops).
    nnx: NNX template; `{i}` if and only if `linen` has it (None likewise).
    linen_stacked: Linen path of the same parameter stacked over layers by
      `nn.scan` (layer rules only; `None` if no scanned form).
    nnx_stacked: NNX path of the stacked parameter (`nnx.vmap`/`nnx.scan`).
    transform: a `converters.transforms.Rearrange` for a port that changed
      the parameter's shape (reshaped, transposed, fused or split). A fused
      parameter's parts are listed on their side as a tuple of templates,
      in the order of the pattern's part axis: `linen=('q/kernel',
      'k/kernel', 'v/kernel'), nnx='qkv/kernel'` (and tuples for the stacked
      templates of that side).

  Each side has the forms of its model: looped, stacked or both. A
  conversion needs the source's form and the target's form it asks for:
  `PathRule(None, 'blocks/{i}/w', linen_stacked='ScanBlock_0/w')` converts
  a scanned Linen model to a looped port and back.

  A one-sided rule (`only`, made by `PathRule.nnx_only` / `linen_only`)
  names state only one side has: `PathRule.nnx_only('pos_table')` says the
  NNX port holds `pos_table` and Linen does not (it computes the table on
  the fly). Converting into NNX keeps the target's value there; converting
  from NNX leaves it out. It is never implied by a missing template, so a
  forgotten path is refused, not read as "keep the target's value".
  """

  linen: Templates | None
  nnx: Templates | None
  linen_stacked: Templates | None = None
  nnx_stacked: Templates | None = None
  transform: Rearrange | None = None
  only: Framework | None = None

  def to_python(self, indent: str = '') -> str:
    """The rule as the Python that makes it, its default fields left out
    (a fused parameter's parts one per line, `indent` deeper than the rule)."""
    if self.only is not None:
      stacked = getattr(self, f'{self.only}_stacked')
      extra = '' if stacked is None else f', {self.only}_stacked={stacked!r}'
      return f'PathRule.{self.only}_only({getattr(self, self.only)!r}{extra})'
    args = [repr(self.linen), repr(self.nnx)]
    args += [
        f'{field}={getattr(self, field)!r}' for field in ('linen_stacked', 'nnx_stacked')
        if getattr(self, field) is not None
    ]
    if self.transform is not None:
      args.append(f'transform={self.transform!r}')
    if indent and (isinstance(self.linen, tuple) or isinstance(self.nnx, tuple)):  # a fused parameter's parts
      return 'PathRule(\n' + ''.join(f'{indent}    {a},\n' for a in args) + f'{indent})'
    return f'PathRule({", ".join(args)})'

  @classmethod
  def nnx_only(cls, nnx: Templates, *, nnx_stacked: Templates | None = None) -> PathRule:
    """State only the NNX port has, at `nnx` (and `nnx_stacked`): kept from an
    NNX target, left out of an NNX source."""
    return cls(None, nnx, nnx_stacked=nnx_stacked, only='nnx')

  @classmethod
  def linen_only(cls, linen: Templates, *, linen_stacked: Templates | None = None) -> PathRule:
    """State only the Linen model has, at `linen` (in any collection): kept
    from a Linen target, left out of a Linen source."""
    return cls(linen, None, linen_stacked=linen_stacked, only='linen')

  def __post_init__(self):
    self._normalise_templates()
    self._check_tokens()
    self._check_sides()
    self._check_transform()
    self._check_layer_templates()
    self._check_counted()

  def _normalise_templates(self) -> None:
    """Each side's templates as one spelling: a str, or a tuple of two or more."""
    for field in ('linen', 'nnx', 'linen_stacked', 'nnx_stacked'):
      value = getattr(self, field)
      if not (value is None) and not (
          isinstance(value, str)
          or (isinstance(value, (tuple, list)) and value and all(isinstance(t, str) for t in value))
      ):
        raise PathMappingError(
            f'rule {self}: {field}={value!r}; give a path template (str), or a '
            'tuple of them for the parts of a fused parameter'
        )
      if isinstance(value, list) or (isinstance(value, tuple) and len(value) == 1):
        object.__setattr__(self, field, value[0] if len(value) == 1 else tuple(value))
      value = getattr(self, field)
      if value is not None:  # one spelling per key: ("kernel", "u") reads as ('kernel', 'u')
        fw = 'nnx' if field.startswith('nnx') else 'linen'
        normal = tuple(_normal_template(t, fw) for t in _as_templates(value))
        object.__setattr__(self, field, normal[0] if isinstance(value, str) else normal)

  def _check_sides(self) -> None:
    """Both sides given, or one side's state only (`only`), as its factory writes it."""
    absent = [fw for fw in ('linen', 'nnx') if getattr(self, fw) is None and getattr(self, f'{fw}_stacked') is None]
    if self.only not in (None, 'linen', 'nnx'):
      raise PathMappingError(f"rule {self}: only={self.only!r}; pass 'linen', 'nnx' or None")
    if self.only is None and absent:
      fw, other = absent[0], 'nnx' if absent[0] == 'linen' else 'linen'
      present = self.template(other, 'loop') or self.template(other, 'scan')
      raise PathMappingError(
          f'rule {self}: give the {fw} path ({fw}=..., with {_INDEX} for looped '
          f'layers), its stacked path ({fw}_stacked=...), or both'
          + (f"; for state only the {_SIDE_NAMES[other]} side has, write PathRule.{other}_only({present!r})"
             if present else '')
      )
    if self.only is not None and absent != ['nnx' if self.only == 'linen' else 'linen']:
      raise PathMappingError(
          f'rule {self}: a rule of state only the {_SIDE_NAMES[self.only]} side has gives '
          f'{self.only} templates and none of the other side (PathRule.{self.only}_only(...))'
      )
    if self.only is not None and any(
        isinstance(t, tuple) and len(t) > 1 for t in (getattr(self, self.only), getattr(self, f'{self.only}_stacked'))
    ):
      raise PathMappingError(
          f'rule {self}: a rule of state only one side has names one path; write one '
          f'PathRule.{self.only}_only(...) per path'
      )
    if self.only is not None and self.transform is not None:
      raise PathMappingError(
          f'rule {self}: a rule of state only one side has takes no transform: there '
          'is nothing to convert'
      )

  def _check_transform(self) -> None:
    """A transform is a `Rearrange`, fusing one template of one side from a
    tuple of the other's; several templates on a side need one."""
    if self.transform is not None and not isinstance(self.transform, Rearrange):
      raise PathMappingError(
          f'rule {self}: transform={self.transform!r}; pass a Rearrange '
          "(e.g. Rearrange('e h d -> e (h d)', h=8)) or None"
      )
    counts = {}
    for fw in ('linen', 'nnx'):
      found = {len(t) for t in (self.templates(fw, 'loop'), self.templates(fw, 'scan')) if t} or {1}
      if len(found) > 1:
        raise PathMappingError(
            f'rule {self}: give {fw}_stacked one template per {fw} template'
        )
      counts[fw] = found.pop()
    if self.transform is not None and self.transform.part_axis is not None:
      parted = 'nnx' if self.transform.fused_side == 'linen' else 'linen'
      if counts[self.transform.fused_side] != 1 or counts[parted] < 2:
        raise PathMappingError(
            f'rule {self}: its transform fuses parts on the {self.transform.fused_side} '
            f'side (part axis {self.transform.part_axis}), so give one '
            f'{self.transform.fused_side} template and a tuple of two or more {parted} '
            'templates, one per part'
        )
    elif max(counts.values()) > 1:
      raise PathMappingError(
          f'rule {self}: several templates on one side need a transform that '
          "fuses them, e.g. transform=Rearrange('e h d -> e (qkv h d)')"
      )

  def _check_layer_templates(self) -> None:
    """`{i}` once in every looped template or in none; stacked templates
    only beside looped ones, and without it."""
    looped = [t for fw in ('linen', 'nnx') for t in self.templates(fw, 'loop') or ()]
    indexed = [bool(_INDEX_TOKEN.search(t)) for t in looped]
    if len(set(indexed)) > 1 or any(len(_INDEX_TOKEN.findall(t)) > 1 for t in looped):
      raise PathMappingError(
          f'rule {self}: put {_INDEX} exactly once in every template (a layer '
          'parameter) or in none (a parameter outside the layers)'
      )
    has_stacked = self.linen_stacked is not None or self.nnx_stacked is not None
    if has_stacked and not any(indexed):
      raise PathMappingError(
          f'rule {self}: stacked templates belong to layer rules: give the looped '
          f'template of at least one side, with {_INDEX} (a parameter stacked on both '
          "sides and looped on neither is a plain rule: PathRule('linen/path', 'nnx/path'))"
      )
    stacked = [t for fw in ('linen', 'nnx') for t in self.templates(fw, 'scan') or ()]
    if any(_INDEX_TOKEN.search(t) for t in stacked):
      raise PathMappingError(
          f'rule {self}: stacked templates have no {_INDEX} (the layer index is '
          'axis 0 of the stacked array)'
      )

  def _check_tokens(self) -> None:
    for field in ('linen', 'nnx', 'linen_stacked', 'nnx_stacked'):
      for template in _as_templates(getattr(self, field)) or ():
        wrong = [t for t in re.findall(r'\{[^{}]*\}', template) if not _VALID_TOKEN.fullmatch(t)]
        if wrong:
          raise PathMappingError(
              f'rule {self}: {wrong[0]} in {field}={template!r} is no index: write {_INDEX} for a '
              "loop's layer ({i+1} where its first is numbered 1), {n} for the layer numbered "
              'after the loop ({n+1} for the one after it)'
          )

  def _check_counted(self) -> None:
    for field in ('nnx', 'nnx_stacked', 'linen_stacked'):
      if any(_counted_key(t, 'nnx' if field.startswith('nnx') else 'linen')
             for t in _as_templates(getattr(self, field)) or ()):
        raise PathMappingError(
            f'rule {self}: {{n}} numbers a Linen layer after a loop\'s (linen=\'Dense_{{n}}/kernel\'); '
            f'{field} cannot hold it: write the path the {field.split("_")[0]} side has'
        )
    templates = _as_templates(self.linen) or ()
    counted = [t for t in templates if _counted_key(t, 'linen')]
    if not counted:
      return
    if self.layered or self.only is not None or len(templates) > 1 or any(
        sum(bool(_COUNTED_KEY.match(k)) for k in parse_path(t, 'linen') if isinstance(k, str)) > 1
        for t in templates):
      raise PathMappingError(
          f'rule {self}: a counted key (Dense_{{n}}, Dense_{{n+1}}) names one Linen layer after '
          f'a loop\'s: give it in one linen template, once, in a rule of both sides without {_INDEX}'
      )

  @functools.cached_property
  def counted(self) -> tuple[tuple, str, int] | None:
    """`(keys before, name, after)` of a counted rule's Linen key
    (`('Dense', 0)` for `Dense_{n}` at the top, `after` 1 for `Dense_{n+1}`); None else."""
    templates = _as_templates(self.linen) or ()
    return _counted_key(templates[0], 'linen') if len(templates) == 1 else None

  def counting(self, count: int) -> PathRule:
    """This counted rule with its key numbered for a loop of `count` layers."""
    before, name, after = self.counted
    keys = parse_path(self.linen, 'linen')
    resolved = format_path((*before, f'{name}_{count + after}', *keys[len(before) + 1:]))
    return dataclasses.replace(self, linen=resolved)

  @property
  def layered(self) -> bool:
    return any(
        _INDEX_TOKEN.search(t) for fw in ('linen', 'nnx') for t in self.templates(fw, 'loop') or ()
    )

  def templates(self, framework: Framework, layout: Layout) -> tuple[str, ...] | None:
    """The templates of `framework` in `layout`: one, or one per part of a
    fused parameter; None when that side has no such form."""
    if layout == 'scan':
      return _as_templates(self.linen_stacked if framework == 'linen' else self.nnx_stacked)
    return _as_templates(self.linen if framework == 'linen' else self.nnx)

  def template(self, framework: Framework, layout: Layout) -> str | None:
    """The template of `framework` in `layout`, for messages (parts joined by ' & ')."""
    templates = self.templates(framework, layout)
    return None if templates is None else ' & '.join(templates)

  def parts(self, framework: Framework) -> int:
    """How many arrays one parameter is on the `framework` side (fused: several)."""
    return len(self.templates(framework, 'loop') or self.templates(framework, 'scan'))

  def layouts(self, framework: Framework) -> tuple[Layout, ...]:
    """The layouts the `framework` side has a form for (none for the side a
    one-sided rule says has no such state)."""
    if self.only not in (None, framework):
      return ()
    if not self.layered:
      return ('plain',)
    return tuple(layout for layout in ('loop', 'scan') if self.templates(framework, layout))

  def missing_form(self, framework: Framework, layout: Layout) -> str | None:
    """Why this rule cannot give a `framework` path in `layout`, or None if it can."""
    if layout == 'plain' or not self.layered or self.templates(framework, layout) is not None:
      return None
    form, field = ('stacked', f'{framework}_stacked') if layout == 'scan' else ('looped', framework)
    return (
        f'its rule has no {form} form on the {"Linen" if framework == "linen" else "NNX"} '
        f'side ({field}=None)'
    )

  def path(self, framework: Framework, layout: Layout, index: int | None, part: int = 0) -> tuple:
    templates = self.templates(framework, layout)
    if templates is None:
      raise PathMappingError(
          f'rule {self}: {self.missing_form(framework, layout)}; give '
          f'{framework}_stacked= to convert to a scanned layout' if layout == 'scan' else
          f'rule {self}: {self.missing_form(framework, layout)}; give {framework}= '
          f'(with {_INDEX}) to convert to a looped layout'
      )
    template = templates[part]
    text = _INDEX_TOKEN.sub(lambda m: str(index + int(m['offset'] or 0)), template) if layout == 'loop' else template
    return parse_path(text, framework)


_INDEX_KEY = re.compile(r'(?:0|[1-9][0-9]*)\Z', re.ASCII)


def _counted_key(template: str, framework: Framework) -> tuple[tuple, str, int] | None:
  """`(keys before, name, after)` of the first counted key of `template`."""
  keys = parse_path(template, framework)
  for position, key in enumerate(keys):
    if isinstance(key, str) and (m := _COUNTED_KEY.match(key)):
      return keys[:position], m['name'], int(m['after'] or 0)
  return None


@dataclasses.dataclass(frozen=True)
class KeptPath(PathRule):
  """A path that no rule matches, kept as it is (`keep_unmatched`): its keys, not a template.

  NNX list indices (ints) are Linen's decimal strings; every other key is the
  same on both sides, whatever characters it holds.
  """

  keys: tuple = ()

  def __post_init__(self):
    pass  # its keys are not templates: a `{i}` in them is a key's text

  @classmethod
  def of(cls, framework: Framework, path: Sequence) -> KeptPath:
    text = format_path(path)
    linen = tuple(str(k) for k in path)
    nnx = tuple(int(k) if isinstance(k, str) and _INDEX_KEY.match(k) else k for k in path)
    if framework == 'nnx':
      strings = [k for k in path if isinstance(k, str) and _INDEX_KEY.match(k)]
      if strings:
        raise PathMappingError(
            f'{text}: NNX key {strings[0]!r} is a string of digits, which Linen would '
            'give back as a list index; rename it, or map it with a PathRule',
            [text],
        )
    return cls(linen='<kept>', nnx='<kept>', keys=linen if framework == 'nnx' else nnx)

  def path(self, framework: Framework, layout: Layout, index: int | None, part: int = 0) -> tuple:
    return self.keys

  def templates(self, framework: Framework, layout: Layout) -> tuple[str, ...] | None:
    return (format_path(self.keys),)


@dataclasses.dataclass(frozen=True)
class _Binding:
  """A mapping bound to one model: each counted rule numbered (`resolved`),
  each loop rule's length (`lengths`)."""

  resolved: dict
  lengths: dict


def _count_families(rules: Sequence[PathRule]) -> dict[tuple, tuple[dict[PathRule, int], list[PathRule]]]:
  """`{(keys before, name): ({loop rule: its first number}, counted rules)}`
  of each key counted after a loop's (`Dense_{n}` after `Dense_{i}` under
  the same keys); refuses a counted rule with no loop to count."""
  families: dict[tuple, tuple[dict, list]] = {}
  for rule in rules:
    if rule.counted is not None:
      before, name, _ = rule.counted
      families.setdefault((before, name), ({}, []))[1].append(rule)
  if not families:  # most mappings: nothing counts
    return families
  for rule in rules:
    for template in (rule.templates('linen', 'loop') or ()) if rule.layered else ():
      keys = parse_path(template, 'linen')
      for (before, name), (loops, _) in families.items():
        if (keys[:len(before)] == before and len(keys) > len(before) and isinstance(keys[len(before)], str)
            and (m := _INDEX_TOKEN.fullmatch(keys[len(before)].removeprefix(f'{name}_')))
            and keys[len(before)].startswith(f'{name}_')):
          loops[rule] = int(m['offset'] or 0)
  lonely = [format_path((*before, f'{name}_{{n}}')) for (before, name), (loops, _) in families.items() if not loops]
  if lonely:
    raise PathMappingError(
        f'{format_offenders(lonely)} count the layers of a loop no rule names; give the '
        f"loop's rules (PathRule('{lonely[0].replace('{n}', _INDEX)}/...', ...)) or number the layer",
        lonely,
    )
  return families


def _compile(template: str) -> re.Pattern:
  pieces, end = [], 0
  for m in _INDEX_TOKEN.finditer(template):
    pieces += [re.escape(template[end:m.start()]), r'(?P<i>0|[1-9]\d*)']
    end = m.end()
  return re.compile(''.join(pieces) + re.escape(template[end:]) + r'\Z')


def _index_offset(template: str) -> int:
  """What the template's index token adds to the layer index (`{i+1}`: 1)."""
  m = _INDEX_TOKEN.search(template)
  return int(m['offset'] or 0) if m else 0


@dataclasses.dataclass(frozen=True)
class Match:
  """What a path is: which rule, in which layout, for which layer."""

  rule: PathRule
  layout: Layout
  index: int | None
  part: int = 0


class PathMapping:
  """An ordered set of `PathRule`s; every path must match exactly one.

  With `keep_unmatched=True`, a path that no rule matches keeps its own path
  in the other framework (NNX list indices are Linen's digit strings).
  """

  def __init__(self, rules: Iterable[PathRule], *, keep_unmatched: bool = False,
               _binding: _Binding | None = None):
    self.rules = tuple(rules)
    if not isinstance(keep_unmatched, bool):
      raise PathMappingError(f'keep_unmatched={keep_unmatched!r}: pass True or False')
    self.keep_unmatched = keep_unmatched
    self._one_sided = any(rule.only is not None for rule in self.rules)
    self._families = _count_families(self.rules)
    # Bound to one model (`bound`): its counted rules numbered, its loops'
    # lengths known. Unbound, a counted rule names nothing.
    self._binding = _binding
    resolved = _binding.resolved if _binding is not None else {}
    self._patterns = [
        (rule, layout, fw, part, template, _compile(template), _index_offset(template))
        for given in self.rules
        if (rule := resolved.get(given, given)).counted is None
        for fw in ('linen', 'nnx')
        for layout in rule.layouts(fw)
        for part, template in enumerate(rule.templates(fw, layout))
    ]
    seen: dict[tuple, tuple] = {}
    duplicates = []
    for rule, layout, fw, part, template, pattern, _ in self._patterns:
      key = (fw, pattern.pattern)
      if key in seen and seen[key] != (rule, part):
        duplicates.append(f'{fw} {template!r}')
      seen[key] = (rule, part)
    if duplicates:
      raise PathMappingError(
          'several rules share a template, so their paths are ambiguous: '
          f'{format_offenders(duplicates)}; keep one rule per template',
          duplicates,
      )

  @property
  def resolved_rules(self) -> tuple[PathRule, ...]:
    """The rules as they match: a bound mapping's counted rules numbered."""
    resolved = self._binding.resolved if self._binding is not None else {}
    return tuple(resolved.get(rule, rule) for rule in self.rules)

  @property
  def is_bound(self) -> bool:
    """Whether every rule names its paths: no rule counts, or the mapping is bound."""
    return not self._families or self._binding is not None

  def bound(self, framework: Framework, leaves: Iterable[Sequence] | Mapping[tuple, Any]) -> PathMapping:
    """This mapping bound to one model, given the paths of its variables on
    the `framework` side (every collection; a mapping to their arrays or
    shapes also reads a stacked loop's length from axis 0): each counted
    rule (`Dense_{n}/kernel`) numbered by its loop's length there, each
    loop rule held below that length on the Linen side. The rules stay as
    given (`rules`, `to_python`, `+`); bind again for another model. Itself
    when no rule counts.

    Raises:
      PathMappingError: a counted rule beside a loop Linen stacks, or loop
        rules of one key numbering the loop's first layer differently.
    """
    if not self._families:
      return self
    shapes = {tuple(p): getattr(v, 'shape', v) for p, v in leaves.items()} if isinstance(leaves, Mapping) else {}
    paths = list(shapes) if shapes else [tuple(p) for p in leaves]
    lengths, resolved = {}, {}
    for (before, name), (loops, counted) in self._families.items():
      first = set(loops.values())
      if len(first) != 1:
        raise PathMappingError(
            f'the loop rules {format_offenders(sorted(str(r.linen) for r in loops))} number the loop\'s '
            f'first layer differently; give them one index ({_INDEX} or {{i+1}}, ...)'
        )
      (first,) = first
      matches = [(p, m) for p in paths for m in self._matches(framework, p) if m.rule in loops]
      if framework == 'linen':
        if any(m.layout == 'scan' for _, m in matches):
          raise PathMappingError(
              f'{format_path((*before, name + "_{n}"))} numbers a layer after a loop Linen runs, but '
              'this Linen model stacks that loop (nn.scan), which Linen numbers as one module: '
              'write that layer\'s rule with its own number for the stacked model'
          )
        length = self._linen_length(paths, before, name, first=first, loops=loops, counted=counted)
      else:
        length = max([m.index + 1 for _, m in matches if m.layout == 'loop']
                     + [int(shapes[p][0]) for p, m in matches if m.layout == 'scan' and len(shapes.get(p, ())) > 0]
                     + [0])
      lengths.update(dict.fromkeys(loops, length))
      resolved.update({rule: rule.counting(first + length) for rule in counted})
    return PathMapping(self.rules, keep_unmatched=self.keep_unmatched, _binding=_Binding(resolved, lengths))

  def _linen_length(self, paths, before: tuple, name: str, *, first: int, loops, counted) -> int:
    """The length of a loop in a Linen model's `paths`: Linen numbers every
    layer of the class, the counted ones right after the loop's, so with
    them all present it is the count less theirs. A tree that lacks some
    (gradients of the parameters, where a counted layer has only batch
    statistics) takes the next length at which every path of the class
    has its rule."""
    numbered = {}
    for p in paths:
      if len(p) > len(before) and p[:len(before)] == before and isinstance(p[len(before)], str) and (
          m := re.fullmatch(rf'{re.escape(name)}_(0|[1-9]\d*)', p[len(before)])):
        numbered[p] = int(m[1])
    total = max(numbered.values(), default=-1) + 1
    after = max(rule.counted[2] for rule in counted) + 1
    looped = {p for p in numbered for m in self._matches('linen', p) if m.rule in loops and m.layout == 'loop'}

    def holds(length: int) -> bool:
      patterns = [_compile(rule.counting(first + length).linen) for rule in counted]
      return all(
          k < first or (p in looped if k < first + length else any(t.match(format_path(p)) for t in patterns))
          for p, k in numbered.items()
      )

    start = max(0, total - first - after)
    return next((n for n in range(start, max(start, total - first) + 1) if holds(n)), start)

  @classmethod
  def identity(cls) -> PathMapping:
    """Every parameter keeps its path: for ports that kept Linen's names."""
    return cls((), keep_unmatched=True)

  def __add__(self, rules: Iterable[PathRule]) -> PathMapping:
    return PathMapping(self.rules + tuple(rules), keep_unmatched=self.keep_unmatched)

  def _key(self) -> tuple:
    lengths = None if self._binding is None else frozenset(self._binding.lengths.items())
    return self.rules, self.keep_unmatched, lengths

  def __eq__(self, other) -> bool:
    return self._key() == other._key() if isinstance(other, PathMapping) else NotImplemented

  def __hash__(self) -> int:
    return hash(self._key())

  def __repr__(self) -> str:
    keep = ', keep_unmatched=True' if self.keep_unmatched else ''
    return f'PathMapping({list(self.rules)!r}{keep})'

  def to_python(self, name: str = 'PATHS') -> str:
    """The mapping as Python source to keep in your code (what `infer_paths`
    found, reviewed and committed): imports, then `NAME = PathMapping([...])`."""
    names = ['PathMapping', 'PathRule'] + (
        ['Rearrange'] if any(r.transform is not None for r in self.rules) else []
    )
    lines = [f'from converters import {", ".join(names)}', '', f'{name} = PathMapping([']
    for rule in self.rules:
      lines.append(f'    {rule.to_python(indent="    ")},')
    lines.append('], keep_unmatched=True)' if self.keep_unmatched else '])')
    return '\n'.join(lines) + '\n'

  def _matches(self, framework: Framework, path: Sequence) -> list[Match]:
    text = format_path(path)
    found = []
    for rule, layout, fw, part, _, pattern, offset in self._patterns:
      if fw == framework and (m := pattern.match(text)):
        if layout != 'loop':
          found.append(Match(rule, layout, None, part))
        elif int(m['i']) >= offset:  # `Dense_0` is no layer of `Dense_{i+1}`
          found.append(Match(rule, layout, int(m['i']) - offset, part))
    return found

  def match_all(self, framework: Framework, path: Sequence) -> list[Match]:
    """Every rule that names `path`. A counted rule names nothing until the
    mapping is bound to a model's paths (`bound`; `match` binds itself)."""
    lengths = self._binding.lengths if self._binding is not None else {}
    found = [
        m for m in self._matches(framework, path)
        if not (framework == 'linen' and m.layout == 'loop' and m.index >= lengths.get(m.rule, m.index + 1))
    ]
    if not found and self.keep_unmatched:
      found.append(Match(KeptPath.of(framework, path), 'plain', None))
    return found

  def describe(self, framework: Framework, path: Sequence) -> str:
    """Which rule names `path` (a `framework` path), in a few words for messages:
    `rule 'Dense_0/kernel' <-> 'up/kernel'`, `kept: no rule names it`, or
    `no rule names it`."""
    found = self.match_all(framework, path)
    if not found:
      return 'no rule names it'
    if len(found) > 1:
      return f'{len(found)} rules name it'
    match = found[0]
    if isinstance(match.rule, KeptPath):
      return 'kept: no rule names it'
    if match.rule.only is not None:
      return f'{_SIDE_NAMES[match.rule.only]} only: kept from a target, left out of a source'
    linen, nnx = (match.rule.template(fw, match.layout) for fw in ('linen', 'nnx'))
    return f'rule {linen!r} <-> {nnx!r}'

  def only(self, framework: Framework, path: Sequence) -> bool:
    """Whether `path` (a `framework` path) is state only `framework` has: a
    one-sided rule names it, and no other rule does."""
    if not self._one_sided:  # most mappings: no path to match on every leaf
      return False
    found = self.match_all(framework, path)
    return len(found) == 1 and found[0].rule.only == framework

  def match(self, framework: Framework, paths: Iterable[Sequence]) -> dict[tuple, Match]:
    """The one `Match` of every path (the mapping bound to them); raises
    listing every unmapped or ambiguous path."""
    paths = [tuple(p) for p in paths]
    bound = self if self.is_bound else self.bound(framework, paths)
    result, unmapped, ambiguous = {}, [], []
    for path in paths:
      found = bound.match_all(framework, path)
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
    problems, fixes = [], []
    if unmapped:
      problems.append(f'no rule maps these {framework} paths: {format_offenders(unmapped)}')
      fixes.append(UNMAPPED_FIX)
    if ambiguous:
      problems.append(
          f'several rules map these {framework} paths: {format_offenders(ambiguous)}'
      )
      fixes.append('make the templates disjoint')
    if problems:
      raise PathMappingError('; '.join(problems), unmapped + ambiguous, fix='; '.join(fixes))
    return result


def as_mapping(paths) -> PathMapping:
  """A `PathMapping`, or any iterable of `PathRule`s made into one."""
  if isinstance(paths, PathMapping):
    return paths
  if isinstance(paths, (str, bytes)) or not isinstance(paths, Iterable):
    raise PathMappingError(
        f'paths={paths!r}: pass a PathMapping or an iterable of PathRule '
        '(e.g. PathMapping([PathRule(linen=..., nnx=...)]), or None to keep every path)'
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


@dataclasses.dataclass(frozen=True)
class Infer:
  """`paths=Infer(known)`: the mapping inferred from what the two models
  compute (`converters.infer_paths`), with the rules you already know taking
  precedence. `paths='infer'` is `Infer()`."""

  known: PathMapping | None = None

  def __post_init__(self):
    if self.known is not None:
      object.__setattr__(self, 'known', as_mapping(self.known))


def as_infer(paths) -> Infer | None:
  """`paths` as an `Infer` if it asks for inference ('infer' or `Infer`), else None."""
  if isinstance(paths, Infer):
    return paths
  if isinstance(paths, str) and paths == 'infer':
    return Infer()
  return None


def resolve(paths) -> PathMapping:
  """The mapping a conversion uses: `paths=None` (the default) keeps every path
  (`PathMapping.identity()`); anything else is read by `as_mapping`."""
  return PathMapping.identity() if paths is None else as_mapping(paths)
