"""The values a configuration's string and enum fields switch the source on.

A field holding a string (`activation: str = 'relu'`) or an enum member
(`norm: Norm = Norm.LAYER`) picks code by comparison (`if self.activation ==
'gelu'`, `in ('gelu', 'tanh')`, `match`), or by a dict indexed with it
(`{'relu': nn.relu, 'gelu': nn.gelu}[self.activation]`). The port is traced
and proven at each value the source names (every member of an enum), so
that every branch is written from a traced run and proven, not copied
untried.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect


@functools.cache
def _tree(path: str) -> ast.Module | None:
  try:
    with open(path, encoding='utf-8') as f:
      return ast.parse(f.read())
  except (OSError, SyntaxError, UnicodeDecodeError):
    return None


def _field_of(node: ast.AST) -> str | None:
  """`activation` of `self.activation`, `config.activation`, `cfg.model.activation`."""
  return node.attr if isinstance(node, ast.Attribute) else None


def _strings(node: ast.AST) -> list[str]:
  """The string constants `node` is, or holds (a tuple, list or set of them)."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return [node.value]
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return [s for e in node.elts for s in _strings(e)]
  return []


def named_strings(paths: list[str]) -> dict[str, set[str]]:
  """`{field name: the strings the sources compare it with or index a dict
  literal by it}` over the files at `paths`."""
  found: dict[str, set[str]] = {}
  for path in paths:
    tree = _tree(path)
    if tree is None:
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        for a, b in zip(sides, sides[1:]):
          for field, other in ((_field_of(a), b), (_field_of(b), a)):
            if field is not None and _strings(other):
              found.setdefault(field, set()).update(_strings(other))
      elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
        field = _field_of(node.slice)
        if field is not None:
          found.setdefault(field, set()).update(s for k in node.value.keys if k is not None for s in _strings(k))
      elif isinstance(node, ast.Match) and (field := _field_of(node.subject)) is not None:
        for case in node.cases:
          patterns = case.pattern.patterns if isinstance(case.pattern, ast.MatchOr) else [case.pattern]
          found.setdefault(field, set()).update(
              p.value.value for p in patterns
              if isinstance(p, ast.MatchValue) and isinstance(p.value, ast.Constant) and isinstance(p.value.value, str)
          )
  return found


def alternatives(value, field: str, strings: dict[str, set[str]]) -> list | None:
  """The other values field `field` holding `value` switches on, in a
  fixed order; None for a string the sources never compare (its values
  unknown), `[]` for a field that is no string or enum."""
  if isinstance(value, enum.Enum):
    return [member for member in type(value) if member is not value]
  if isinstance(value, str):
    if field not in strings:
      return None
    return sorted(strings[field] - {value})
  return []


def source_paths(classes) -> list[str]:
  """The files defining `classes` that can be read."""
  paths = []
  for cls in classes:
    try:
      paths.append(inspect.getsourcefile(cls))
    except TypeError:
      continue
  return sorted({p for p in paths if p})
