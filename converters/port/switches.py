"""What the sources do with a configuration's fields: the values its string
and enum fields switch the source on, and the tuples it loops over.

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


def _compared(tree: ast.AST, key) -> dict[str, set[str]]:
  """`{key(expression): the strings it is compared with, or indexes a dict
  literal by, or is matched against}` in `tree`, for the expressions `key`
  names (None: not one of them)."""
  found: dict[str, set[str]] = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      for a, b in zip(sides, sides[1:]):
        for field, other in ((key(a), b), (key(b), a)):
          if field is not None and _strings(other):
            found.setdefault(field, set()).update(_strings(other))
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
      field = key(node.slice)
      if field is not None:
        found.setdefault(field, set()).update(s for k in node.value.keys if k is not None for s in _strings(k))
    elif isinstance(node, ast.Match) and (field := key(node.subject)) is not None:
      for case in node.cases:
        patterns = case.pattern.patterns if isinstance(case.pattern, ast.MatchOr) else [case.pattern]
        found.setdefault(field, set()).update(
            p.value.value for p in patterns
            if isinstance(p, ast.MatchValue) and isinstance(p.value, ast.Constant) and isinstance(p.value.value, str)
        )
  return found


def _handed_on(tree: ast.Module) -> dict[str, set[str]]:
  """`{field name: strings}` for fields handed to a function of the file
  that compares the parameter taking them (big_vision's `get_posemb(self,
  self.posemb, ...)`, whose `typ == 'learn'`)."""
  functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
  by_parameter = {name: _compared(f, lambda n: n.id if isinstance(n, ast.Name) else None)
                  for name, f in functions.items()}
  found: dict[str, set[str]] = {}
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions):
      continue
    params = [a.arg for a in (*functions[node.func.id].args.posonlyargs, *functions[node.func.id].args.args)]
    handed = [(params[i] if i < len(params) else None, a) for i, a in enumerate(node.args)]
    handed += [(k.arg, k.value) for k in node.keywords]
    for param, arg in handed:
      field = _field_of(arg)
      if field is not None and param in by_parameter[node.func.id]:
        found.setdefault(field, set()).update(by_parameter[node.func.id][param])
  return found


def named_strings(paths: list[str]) -> dict[str, set[str]]:
  """`{field name: the strings the sources compare it with or index a dict
  literal by it}` over the files at `paths`, directly or through a
  function of the file it is handed to."""
  found: dict[str, set[str]] = {}
  for path in paths:
    for field, strings in _named_in(path).items():
      found.setdefault(field, set()).update(strings)
  return found


@functools.cache
def _named_in(path: str) -> dict[str, frozenset[str]]:
  """`named_strings` of one file, read once as `_tree` is (a port traces
  many configurations, each asking again)."""
  tree = _tree(path)
  found: dict[str, set[str]] = {}
  if tree is not None:
    for compared in (_compared(tree, _field_of), _handed_on(tree)):
      for field, strings in compared.items():
        found.setdefault(field, set()).update(strings)
  return {field: frozenset(strings) for field, strings in found.items()}


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


def looped_over(paths: list[str]) -> set[str]:
  """The names of the fields the files at `paths` loop over (`for i, n in
  enumerate(self.stage_sizes)`, `[... for w in self.config.widths]`,
  `range(len(self.features))`): a tuple there may be empty, a loop over
  none; a tuple only handed to a layer (`kernel_size=self.patch_size`) sets
  its rank, which no port is written to change."""
  return set().union(*map(_looped_over_in, paths))


@functools.cache
def _looped_over_in(path: str) -> frozenset[str]:
  """`looped_over` of one file, read once as `_tree` is."""
  tree = _tree(path)
  if tree is None:
    return frozenset()
  return frozenset(
      field for node in ast.walk(tree) if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension))
      for n in ast.walk(node.iter) if (field := _field_of(n)) is not None
  )


def source_paths(classes) -> list[str]:
  """The files defining `classes` that can be read."""
  paths = []
  for cls in classes:
    try:
      paths.append(inspect.getsourcefile(cls))
    except TypeError:
      continue
  return sorted({p for p in paths if p})
