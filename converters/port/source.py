"""The Linen source a port is written from: files parsed with libcst, with
positions, and the expressions a trace's `Site`s point at.

libcst keeps every comment and blank line of what it parses, so the classes
a port rewrites keep the user's docstrings and comments. Positions are those
of `libcst.metadata.PositionProvider`, 1-based lines and 0-based columns,
which are Python's own (`tracing.Site`).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types

import libcst as cst
from flax import linen as nn
from libcst.metadata import BuiltinScope, GlobalScope, MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider

from converters.port import syntax, tracing


class SourceFile:
  """One Python file of the user's, parsed."""

  def __init__(self, path: str, module: types.ModuleType):
    self.path = path
    self.python_module = module
    with open(path, encoding='utf-8') as f:
      self.text = f.read()
    # A tree fresh from the parser shares no node, so libcst's defensive copy
    # (a deep copy of every node, about a sixth of the time) is skipped.
    self.wrapper = MetadataWrapper(cst.parse_module(self.text), unsafe_skip_copy=True)
    self.module = self.wrapper.module
    self.positions = self.wrapper.resolve(PositionProvider)
    self.parents = self.wrapper.resolve(ParentNodeProvider)
    self._by_range = {
        (r.start.line, r.start.column, r.end.line, r.end.column): node
        for node, r in self.positions.items()
        if isinstance(node, cst.Call)
    }

  def call_at(self, site: tracing.Site) -> cst.Call | None:
    """The call expression spanning exactly `site`."""
    return self._by_range.get((site.line, site.column, site.end_line, site.end_column))

  def class_def(self, cls: type) -> cst.ClassDef:
    """The top-level `class` statement of `cls`."""
    for statement in self.module.body:
      if isinstance(statement, cst.ClassDef) and statement.name.value == cls.__name__:
        return statement
    raise LookupError(f'{cls.__qualname__} is not a top-level class of {self.path}')

  def ancestors(self, node: cst.CSTNode):
    """`node`'s enclosing nodes, innermost first."""
    while node in self.parents:
      node = self.parents[node]
      yield node

  def ancestors_below(self, node: cst.CSTNode, ancestor: cst.CSTNode):
    """`node`'s enclosing nodes inside `ancestor`, innermost first."""
    for parent in self.ancestors(node):
      if parent is ancestor:
        return
      yield parent

  def code(self, node: cst.CSTNode) -> str:
    return self.module.code_for_node(node)

  def line_of(self, node: cst.CSTNode) -> int:
    return self.positions[node].start.line

  @functools.cached_property
  def names(self) -> frozenset[str]:
    """Every bare name the file mentions (`syntax.names_in` of the whole file)."""
    return frozenset(syntax.names_in(self.module))

  @functools.cached_property
  def attributes_read_off_others(self) -> frozenset[str]:
    """The attribute names the file reads off something other than `self`
    (`config` of `self.encoder.config`, `features` of `model.features`)."""
    found = set()

    class Visitor(cst.CSTVisitor):
      def visit_Attribute(self, n):
        if not syntax.is_self(n.value):
          found.add(n.attr.value)

    self.module.visit(Visitor())
    return frozenset(found)

  @functools.cached_property
  def linen_names(self) -> frozenset[str]:
    """The names the file binds to `flax.linen` (`nn`, usually)."""
    return frozenset(k for k, v in vars(self.python_module).items() if v is nn)

  @functools.cached_property
  def linen_bound(self) -> dict[str, tuple[str, ...]]:
    """The names the file imports bare from Linen (`from flax.linen import
    compact, Dense`, `from flax.linen.initializers import zeros as z`) ->
    where each is in `flax.linen` (`('initializers', 'zeros')`)."""
    bound = {}
    for statement in self.module.body:
      for line in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
        if not isinstance(line, cst.ImportFrom) or isinstance(line.names, cst.ImportStar) or line.relative:
          continue
        module = dotted(line.module) or []
        if module[:2] != ['flax', 'linen']:
          continue
        for alias in line.names:
          name = alias.evaluated_alias or alias.evaluated_name
          value = vars(self.python_module).get(name)
          if value is None or value is nn:
            continue
          # As imported from `flax.linen` or its initializers; else where
          # `flax.linen` has it (`from flax.linen.module import compact` is
          # `('compact',)`).
          path = tuple(module[2:]) + (alias.evaluated_name,)
          if not (module[2:] in ([], ['initializers']) and _resolve(path) is value):
            if id(value) not in _LINEN_OBJECTS and _resolve(path) is not value:
              continue  # bound again since (`gelu = partial(jax.nn.gelu, ...)`): not Linen's
            path = _LINEN_OBJECTS.get(id(value), path)
          bound[name] = path
    return bound

  def linen_path(self, node: cst.BaseExpression) -> tuple[str, ...] | None:
    """Where in `flax.linen` the name or attribute `node` is, however the
    file imports it: `('Dense',)` of `nn.Dense`, of `linen.Dense` and of
    `Dense` imported bare; None for anything else."""
    names = dotted(node)
    if not names:
      return None
    if names[0] in self.linen_names:
      return tuple(names[1:])
    if names[0] in self.linen_bound:
      return self.linen_bound[names[0]] + tuple(names[1:])
    return None


def _linen_objects() -> dict[int, tuple[str, ...]]:
  """id -> path in `flax.linen` of its public classes, functions and
  submodules, and of `nn.initializers`' (the first name of each)."""
  found: dict[int, tuple[str, ...]] = {}
  for prefix, namespace in (((), nn), (('initializers',), nn.initializers)):
    for name in dir(namespace):
      value = getattr(namespace, name)
      if name.startswith('_') or not (callable(value) or isinstance(value, types.ModuleType)):
        continue
      if isinstance(value, type) and value.__module__ == 'builtins':
        continue  # `nn.Any`-like re-exports of Python's own
      found.setdefault(id(value), prefix + (name,))
  return found


_LINEN_OBJECTS = _linen_objects()


def _resolve(path: tuple[str, ...]):
  value = nn
  for name in path:
    value = getattr(value, name, None)
  return value


def dotted(node: cst.BaseExpression) -> list[str] | None:
  """`['nn', 'initializers', 'zeros']` of `nn.initializers.zeros`, or None."""
  if isinstance(node, cst.Name):
    return [node.value]
  if isinstance(node, cst.Attribute):
    head = dotted(node.value)
    return None if head is None else head + [node.attr.value]
  return None


@functools.cache
def source_file(path: str, module_name: str) -> SourceFile:
  """The file at `path` (a real path), parsed, with the imported module it is
  the file of: `module_name` where that is its file (a class's or function's
  `__module__`), else the first module imported from that very path, else
  the first whose file's real path it is."""
  named = sys.modules.get(module_name)
  if named is not None and getattr(named, '__file__', None) and os.path.realpath(named.__file__) == path:
    return SourceFile(path, named)
  modules = [(m, getattr(m, '__file__', None)) for m in list(sys.modules.values())]
  module = next((m for m, file in modules if file == path), None)
  if module is None:
    module = next((m for m, file in modules if file and os.path.realpath(file) == path), None)
  if module is None:
    raise LookupError(f'{path} is not the file of an imported module')
  return SourceFile(path, module)


def file_of(cls: type) -> SourceFile:
  """The parsed file defining `cls`: the file of its module, or, where a
  package re-exports it under its own name (scico sets `DnCNNNet.__module__
  = 'scico.flax'`), the file its methods were compiled from."""
  file = source_file(os.path.realpath(inspect.getsourcefile(cls)), cls.__module__)
  if any(isinstance(s, cst.ClassDef) and s.name.value == cls.__name__ for s in file.module.body):
    return file
  for value in vars(cls).values():
    function = inspect.unwrap(value) if callable(value) else None
    code = getattr(function, '__code__', None)
    if code is not None and getattr(function, '__qualname__', '').startswith(f'{cls.__qualname__}.'):
      return source_file(os.path.realpath(code.co_filename), function.__module__)
  return file


def snake_case(name: str) -> str:
  """`Dense_0` -> `dense_0`, `MultiHeadDotProductAttention` ->
  `multi_head_dot_product_attention`, `LSTMCell` -> `lstm_cell`, `ConvBNBlock`
  -> `conv_bn_block`; one capital after a word belongs to it (`ViTBlock` ->
  `vit_block`, `Conv2D` -> `conv2d`)."""
  out = []
  for i, ch in enumerate(name):
    before = name[i - 1] if i else ''
    after = name[i + 1] if i + 1 < len(name) else ''
    if ch.isupper() and i:
      single = not after.islower() and (not after.isupper() or name[i + 2:i + 3].islower())
      if (before.islower() or before.isdigit()) and not single or before.isupper() and after.islower():
        if out and out[-1] != '_':
          out.append('_')
    out.append(ch.lower())
  return ''.join(out)


def free_names(node: cst.CSTNode) -> set[str]:
  """The names `node` (a class, function or statement of a module) reads
  from its module or builtins: those of `syntax.names_in` less what it binds in a
  scope of its own (a method's local `h` is not the module's function `h`)."""
  wrapper = MetadataWrapper(cst.Module([node]) if isinstance(node, cst.BaseStatement) else
                            cst.Module([cst.SimpleStatementLine([cst.Expr(node)])]),
                            unsafe_skip_copy=True)  # (only read)
  scopes = {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}
  free = set()
  for scope in scopes:
    for access in scope.accesses:
      if not isinstance(access.node, cst.Name):
        continue  # a string annotation's or dotted import's parts
      if all(isinstance(a.scope, (GlobalScope, BuiltinScope)) for a in access.referents):
        free.add(access.node.value)
  return free
