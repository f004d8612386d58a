"""Writing inferred pairs as the rules a person would write.

`fold` turns `(linen path, nnx path)` pairs into `PathRule`s, the layers of a
loop folded into `{i}` templates, and never folds where a template would
also name a path paired otherwise (`Dense_{i}` beside `Dense_2 -> head`):
the rules it returns map every pair to its partner and nothing else.
`stacked_rules` writes the layers of a stacked variable paired with looped
ones; `merge_layouts` joins the mappings of both layouts into rules with
all four paths.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from converters.errors import PathMappingError, format_offenders
from converters.paths import PathMapping, PathRule, format_path


_INDEXED = re.compile(r'^(.*?)(0|[1-9]\d*)$')


def _indices(path: tuple) -> list[tuple[int, str, int]]:
  """`(position, prefix, index)` of every key that ends in a layer index."""
  out = []
  for position, key in enumerate(path):
    if isinstance(key, int):
      out.append((position, '', key))
    elif (m := _INDEXED.match(str(key))):
      out.append((position, m[1], int(m[2])))
  return out


def _template(path: tuple, position: int, prefix: str) -> str:
  """`path` as `format_path` writes it (a key holding `/` quoted), its key
  at `position` the layer index `{i}` after `prefix`."""
  return format_path((*path[:position], prefix + '{i}', *path[position + 1:]))


def fold(
    pairs: Iterable[tuple[tuple, tuple]], reserved: Iterable[tuple[str, tuple]] = ()
) -> list[PathRule]:
  """Rules for `(linen path, nnx path)` pairs, layers of a loop folded into `{i}`.

  A layer family is a pair of key positions (one per side) holding the same
  index: `Block_3` and `blocks/3`. A family counts when at least two indices
  share the rest of their paths; every pair that fits a counted family is
  written once as a template. A template that would also name a path of
  another pair (`Dense_{i}` beside `Dense_2 -> head`), or a `reserved`
  `(framework, path)` that other rules map, is not written: its pairs keep
  rules of their own.
  """
  pairs, reserved = list(pairs), list(reserved)
  barred: set[tuple[str, str]] = set()
  while True:
    rules = _folded(pairs, barred)
    overlapping = _overlapping(pairs, rules, reserved)
    if not overlapping:
      return rules
    barred |= overlapping


def fold_paths(paths: Iterable[tuple], others: Iterable[tuple] = ()) -> list[str]:
  """One side's paths (a port's own tables, `blocks/0/pos`, `blocks/1/pos`)
  as templates where the layers of a loop share the rest of their path
  (`blocks/{i}/pos`), in first-seen order; a template that would also name
  one of `others` (paths other rules hold) is not written."""
  paths = list(dict.fromkeys(tuple(p) for p in paths))
  families: dict[tuple, list[tuple]] = defaultdict(list)
  for path in paths:
    for position, prefix, _ in _indices(path):
      families[position, prefix, path[:position], path[position + 1:]].append(path)
  taken = {tuple(p) for p in others}
  written: dict[tuple, str] = {}
  for (position, prefix, head, tail), members in families.items():
    if len(members) < 2 or any(p in written for p in members):
      continue
    clash = any(
        len(p) == len(members[0]) and p[:position] == head and p[position + 1:] == tail
        and any(q == position and r == prefix for q, r, _ in _indices(p))
        for p in taken
    )
    if not clash:
      template = _template(members[0], position, prefix)
      written.update(dict.fromkeys(members, template))
  return list(dict.fromkeys(written.get(p) or format_path(p) for p in paths))


def _overlapping(pairs, rules: list[PathRule], reserved) -> set[tuple[str, str]]:
  """The folded rules that name a path some other rule's pair holds or a
  reserved one, or that map a path to anything but its partner."""
  templates = [r for r in rules if '{i}' in r.linen]
  if not templates:
    return set()
  mapping = PathMapping(rules)
  bad = {
      (m.rule.linen, m.rule.nnx)
      for framework, path in reserved for m in mapping.match_all(framework, path)
      if m.rule.linen is not None and '{i}' in m.rule.linen
  }
  for lp, np_ in pairs:
    for framework, path, partner in (('linen', lp, np_), ('nnx', np_, lp)):
      other = 'nnx' if framework == 'linen' else 'linen'
      for m in mapping.match_all(framework, path):
        if m.rule.linen is not None and '{i}' in m.rule.linen and (
            len(mapping.match_all(framework, path)) > 1
            or tuple(str(k) for k in m.rule.path(other, m.layout, m.index)) != tuple(str(k) for k in partner)
        ):
          bad.add((m.rule.linen, m.rule.nnx))
  return bad


def _folded(pairs, barred) -> list[PathRule]:
  support: dict[tuple, set[int]] = defaultdict(set)
  for lp, np_ in pairs:
    for la, lprefix, li in _indices(lp):
      for na, nprefix, ni in _indices(np_):
        if li == ni:
          key = (_template(lp, la, lprefix), _template(np_, na, nprefix))
          support[key].add(li)
  families: dict[tuple, set[int]] = defaultdict(set)  # layer prefixes
  for (lt, nt), indices in support.items():
    if len(indices) >= 2:
      lprefix, nprefix = lt[:lt.index('{i}') + 3], nt[:nt.index('{i}') + 3]
      families[lprefix, nprefix] |= indices
  rules, seen = [], set()
  for lp, np_ in pairs:
    chosen = None
    for la, lprefix, li in _indices(lp):
      for na, nprefix, ni in _indices(np_):
        if li != ni:
          continue
        lt, nt = _template(lp, la, lprefix), _template(np_, na, nprefix)
        if (lt[:lt.index('{i}') + 3], nt[:nt.index('{i}') + 3]) in families and (lt, nt) not in barred:
          candidate = (len(support[lt, nt]), lt, nt)
          chosen = max(chosen, candidate) if chosen else candidate
    lt, nt = (chosen[1], chosen[2]) if chosen else (format_path(lp), format_path(np_))
    if (lt, nt) not in seen:
      seen.add((lt, nt))
      rules.append(PathRule(lt, nt))
  return rules


def merge_layouts(looped: PathMapping, stacked: PathMapping) -> PathMapping:
  """One mapping for both layouts: the rules inferred from the looped models
  with the stacked paths inferred from the scanned ones, as `PathRule(linen,
  nnx, linen_stacked, nnx_stacked)`.

  Within one framework a layer's parameter keeps its path below the layer
  (`Block_{i}/mlp/Dense_0/kernel`, stacked `ScanBlock_0/mlp/Dense_0/kernel`),
  so each `{i}` rule pairs with the one stacked rule whose paths end, on both
  sides, as its own do after the layer index. The rules outside the layers
  must be the same in both; one-sided rules (state only one side has) of
  both are kept, each naming its own path.

  Raises:
    PathMappingError: a layer rule with no stacked counterpart or several,
      or rules outside the layers that the two layouts disagree on.
  """
  layered = [r for r in looped.rules if r.layered]
  plain = [r for r in looped.rules if not r.layered]
  plain_keys = {(r.linen, r.nnx) for r in plain}
  # State only one side has (a table in each layer) keeps a rule per path in each layout.
  own = [r for r in stacked.rules if r.only is not None and r not in plain]
  candidates = [r for r in stacked.rules if (r.linen, r.nnx) not in plain_keys and r.only is None]

  def below_layer(template: str) -> str:
    return template.split('{i}', 1)[1].lstrip('/')

  rules, problems, used = [], [], set()
  for rule in layered:
    ends = (below_layer(rule.linen), below_layer(rule.nnx))
    found = [
        s for s in candidates
        if s.linen.endswith('/' + ends[0]) and s.nnx.endswith('/' + ends[1]) and id(s) not in used
    ]
    if len(found) != 1:
      problems.append(
          f'{rule.linen} <-> {rule.nnx}: {len(found)} stacked rules end as it does'
          + (f' ({", ".join(f"{s.linen} <-> {s.nnx}" for s in found)})' if found else '')
      )
      continue
    used.add(id(found[0]))
    rules.append(PathRule(rule.linen, rule.nnx, found[0].linen, found[0].nnx))
  leftover = [f'{s.linen} <-> {s.nnx}' for s in candidates if id(s) not in used]
  if leftover:
    problems.append(f'stacked rules with no looped counterpart: {", ".join(leftover)}')
  if problems:
    raise PathMappingError(
        'the looped and the scanned models do not have the same layers: '
        + format_offenders(problems),
        fix='make both layouts of each model from one configuration, or write the rules '
        'of the layers by hand (PathRule(linen, nnx, linen_stacked, nnx_stacked))',
    )
  return PathMapping(plain + rules + own)


Slot = tuple[tuple, int | None]  # (path, layer of a stacked variable or None)

#: What `stacked_rules` says of layers paired last to first: no rule
#: reverses the order of layers.
REVERSED = 'in reverse order'


def stacked_rules(pairs: list[tuple[Slot, Slot]]) -> tuple[list[PathRule], list[tuple], list[str]]:
  """Rules for the layers of stacked variables paired with looped ones: the
  stacked path on its side, the looped template on the other; `(rules,
  plain pairs, problems)`.

  Layer `l` of a stacked array must pair with layer `l` of one looped family
  (`Block_{i}/...` at `i = l`), for every layer. Two stacked variables whose
  layers pair one to one in their order are one plain pair."""
  layers: dict[tuple[str, tuple], dict[int, tuple]] = defaultdict(dict)
  both: dict[tuple, set] = defaultdict(set)
  for a, b in pairs:
    stacked, looped, side = (a, b, 'linen') if a[1] is not None else (b, a, 'nnx')
    if looped[1] is not None:  # both stacked
      both[a[0], b[0]].add((a[1], b[1]))
      layers[side, stacked[0]][stacked[1]] = None
      continue
    layers[side, stacked[0]][stacked[1]] = looped[0]
  plain = [key for key, found in both.items() if all(i == j for i, j in found)]
  problems = []
  for (lp, np_), found in both.items():
    n = len(found)
    whole = (
        sorted(i for i, _ in found) == sorted(j for _, j in found) == list(range(n))
        and sorted(layers['linen', lp]) == list(range(n)) and ('nnx', np_) not in layers
    )  # every layer of both stacks paired between the two, and only there
    if (lp, np_) not in plain and whole and all(i + j == n - 1 for i, j in found):
      layers.pop(('linen', lp))
      problems.append(
          f'linen {format_path(lp)} and nnx {format_path(np_)} (both stacked): '
          f'their layers pair {REVERSED} (layer i with layer {n - 1} - i)'
      )
  for lp, np_ in plain:
    layers.pop(('linen', lp), None)
  for lp, np_ in plain:
    if ('nnx', np_) in layers and any(p is not None for p in layers[('nnx', np_)].values()):
      problems.append(f'nnx {format_path(np_)} (stacked): its layers pair with variables of two forms')
  rules = []
  for (side, path), looped in layers.items():
    if side == 'nnx' and all(p is None for p in looped.values()) and any(n == path for _, n in plain):
      continue
    template = _layer_template(looped)
    other = 'nnx' if side == 'linen' else 'linen'
    last = len(looped) - 1
    backwards = None if template else _layer_template({last - i: p for i, p in looped.items()})
    if backwards is not None:
      problems.append(
          f'{side} {format_path(path)} (stacked): its layers pair with {other} {backwards} '
          f'{REVERSED} (layer i with {backwards.replace("{i}", f"{{{last} - i}}")})'
      )
      continue
    if template is None:
      shown = ', '.join(
          f'{i}: {"(stacked)" if p is None else format_path(p)}' for i, p in sorted(looped.items())
      )
      problems.append(
          f'{side} {format_path(path)} (stacked): its layers pair with {other} variables '
          f'that are not one family of layers in its order ({shown})'
      )
      continue
    if side == 'linen':
      rules.append(PathRule(None, template, linen_stacked=format_path(path)))
    else:
      rules.append(PathRule(template, None, nnx_stacked=format_path(path)))
  return rules, plain, problems


def _layer_template(looped: dict[int, tuple | None]) -> str | None:
  """The `{i}` template naming `looped[i]` for every layer `i` (0, 1, ...),
  or None. With one layer, the outermost key holding its index."""
  if any(p is None for p in looped.values()) or sorted(looped) != list(range(len(looped))):
    return None
  candidates = None
  for index, path in looped.items():
    found = {
        _template(path, position, prefix)
        for position, prefix, i in _indices(path) if i == index
    }
    candidates = found if candidates is None else candidates & found
  if not candidates:
    return None
  if len(candidates) == 1:
    return candidates.pop()
  first = looped[0]
  for position, prefix, i in _indices(first):  # outermost first
    if i == 0 and (t := _template(first, position, prefix)) in candidates:
      return t
  return None
