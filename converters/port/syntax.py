"""libcst helpers the port's writers share: parsing snippets, names an
expression reads or a target binds, `self.<name>`, arguments spaced as PEP 8
spaces them, and clean-ups of what a rewrite leaves behind (unused locals,
`x = x`)."""

from __future__ import annotations

import libcst as cst


def expression(code: str) -> cst.BaseExpression:
  return cst.parse_expression(code)


def statement(code: str) -> cst.BaseStatement:
  return cst.parse_statement(code)


class NameLoads(cst.CSTVisitor):
  """A visitor of the bare names a node reads, each at `visit_Name`: of
  `a.b`, `a` (`b` is no name in scope); of `f(k=v)`, `v`."""

  def visit_Attribute(self, node: cst.Attribute) -> bool:
    node.value.visit(self)
    return False

  def visit_Arg(self, node: cst.Arg) -> bool:
    node.value.visit(self)
    return False


def names_in(node: cst.CSTNode) -> set[str]:
  """Every bare name an expression or statement mentions."""
  found: set[str] = set()

  class Visitor(NameLoads):
    def visit_Name(self, n: cst.Name):
      found.add(n.value)

  node.visit(Visitor())
  return found


def is_self(node: cst.CSTNode) -> bool:
  """Whether `node` is the name `self`."""
  return isinstance(node, cst.Name) and node.value == 'self'


def self_attribute(node: cst.CSTNode) -> str | None:
  """`'x'` of `self.x`; None for anything else."""
  return node.attr.value if isinstance(node, cst.Attribute) and is_self(node.value) else None


def assigned_once(body: cst.CSTNode) -> dict[str, cst.BaseExpression | None]:
  """Local name -> its value, for names a simple `name = value` binds once
  (None for names bound more than once or otherwise)."""
  seen: dict[str, cst.BaseExpression | None] = {}

  class Visitor(cst.CSTVisitor):
    def visit_Assign(self, n: cst.Assign):
      for target in n.targets:
        for name in target_names(target.target):
          simple = isinstance(target.target, cst.Name) and len(n.targets) == 1
          seen[name] = n.value if simple and name not in seen else None

    def visit_For(self, n: cst.For):
      for name in target_names(n.target):
        seen[name] = None

    def visit_AugAssign(self, n: cst.AugAssign):
      for name in target_names(n.target):
        seen[name] = None

  body.visit(Visitor())
  return seen


def target_names(target: cst.BaseExpression) -> list[str]:
  if isinstance(target, cst.Name):
    return [target.value]
  if isinstance(target, (cst.Tuple, cst.List)):
    return [n for e in target.elements for n in target_names(e.value)]
  return []


def names_bound_by(nodes, kinds: tuple[type, ...]) -> set[str]:
  """The names the `kinds` of node among and inside `nodes` bind
  (`(cst.For,)`: loop targets; `(cst.AssignTarget,)`: assignments')."""
  found: set[str] = set()

  class Visitor(cst.CSTVisitor):
    def on_visit(self, node) -> bool:
      if isinstance(node, kinds):
        found.update(target_names(node.target))
      return True

  for node in nodes:
    node.visit(Visitor())
  return found


def params_normalised(params: list[cst.Param]) -> list[cst.Param]:
  """Parameters without a comma after the last."""
  return params[:-1] + [params[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)] if params else params


#: Builtins whose call has no side effect (`width = int(64 * factor)`).
_PURE_BUILTINS = frozenset({'abs', 'bool', 'float', 'int', 'len', 'max', 'min', 'round', 'str', 'tuple'})


class _SimpleAssignments(cst.CSTVisitor):
  """`name = value` statements whose value calls nothing but pure builtins
  (no side effect)."""

  def __init__(self, replayed: frozenset[str] = frozenset()):
    self.found: list[cst.SimpleStatementLine] = []
    self.replayed = replayed

  def visit_SimpleStatementLine(self, node):
    if len(node.body) == 1 and isinstance(node.body[0], cst.Assign):
      assign = node.body[0]
      calls: list[cst.Call] = []
      assign.value.visit(_CallFinder(calls))
      calls = [c for c in calls if not (isinstance(c.func, cst.Name) and c.func.value in _PURE_BUILTINS)]
      replayed = bool(calls) and code_of(node) in self.replayed
      if (not calls or replayed) and all(_names(t.target) for t in assign.targets):
        self.found.append(node)


def _names(target: cst.BaseExpression) -> bool:
  """A name, or names unpacked (`b, _, d = x.shape`)."""
  if isinstance(target, (cst.Tuple, cst.List)):
    return all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements)
  return isinstance(target, cst.Name)


def _unread_as_underscore(node: cst.SimpleStatementLine, read: set[str]) -> cst.SimpleStatementLine:
  """`node` with each name it unpacks that nothing reads written `_`."""
  assign = node.body[0]
  targets = []
  for t in assign.targets:
    if isinstance(t.target, (cst.Tuple, cst.List)):
      elements = [e.with_changes(value=cst.Name('_')) if e.value.value not in read else e
                  for e in t.target.elements]
      t = t.with_changes(target=t.target.with_changes(elements=elements))
    targets.append(t)
  return node.with_changes(body=[assign.with_changes(targets=targets)])


def without_leading_blank_lines(method: cst.FunctionDef) -> cst.FunctionDef:
  """`method` with no blank line before its first statement (left where the
  statements above it moved to `__init__`); comments stay."""
  body = list(method.body.body)
  if not body or not hasattr(body[0], 'leading_lines'):
    return method
  lines = list(body[0].leading_lines)
  while lines and lines[0].comment is None:
    lines.pop(0)
  body[0] = body[0].with_changes(leading_lines=lines)
  return method.with_changes(body=method.body.with_changes(body=body))


def without_unused_locals(method: cst.FunctionDef, replayed: frozenset[str] = frozenset()) -> cst.FunctionDef:
  """`method` without the simple assignments (no call in the value, or one
  `__init__` replays: `replayed` holds their code) of locals nothing reads
  any more (what served only the moved creations)."""
  while True:
    finder = _SimpleAssignments(replayed)
    method.body.visit(finder)
    unused, unpacked = set(), {}
    for node in finder.found:
      names = {n for t in node.body[0].targets for n in target_names(t.target)} - {'_'}
      read = names & reads(method.body, exclude=node)
      if not read:
        unused.add(node)
      elif names - read - {n for n in names if n.startswith('_')}:
        unpacked[node] = _unread_as_underscore(node, read)  # ruff's RUF059
    if unused:
      method = method.visit(Remove(unused))
    elif unpacked:
      old, new = next(iter(unpacked.items()))
      method = method.deep_replace(old, new)
    else:
      return method


def code_of(node: cst.CSTNode) -> str:
  """A node's code without its surrounding blank lines and comments."""
  if hasattr(node, 'leading_lines'):
    node = node.with_changes(leading_lines=[])
  return cst.Module([]).code_for_node(node).strip()


def calls_in(node: cst.CSTNode) -> bool:
  """Whether `node` calls anything (`normal(stddev=0.1)`: its value may
  differ each time it runs)."""
  found: list[cst.Call] = []
  node.visit(_CallFinder(found))
  return bool(found)


class _CallFinder(cst.CSTVisitor):
  def __init__(self, found):
    self.found = found

  def visit_Call(self, node):
    self.found.append(node)


class Remove(cst.CSTTransformer):
  """`nodes` (statements) removed; their comments go to the statement after
  them in the block, where there is one."""

  def __init__(self, nodes):
    self.nodes = nodes

  def leave_IndentedBlock(self, original, updated):
    body, carried = [], []
    for old, new in zip(original.body, updated.body, strict=True):
      if old in self.nodes:
        carried += [line for line in old.leading_lines if line.comment is not None]
        continue
      if carried:
        new = new.with_changes(leading_lines=[*carried, *new.leading_lines])
        carried = []
      body.append(new)
    if not body:
      body = [cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)]
    return updated.with_changes(body=body)


def without_constant_conditions(method: cst.FunctionDef) -> cst.FunctionDef:
  """`if True:` (what `self.has_variable('cache', ...)` became, directly or
  through a local bound to it once) replaced by its body, the `else` gone;
  `if not True:` by its `else`. The comments above the `if` go with it."""
  constant = {
      name for name, value in assigned_once(method.body).items()
      if isinstance(value, cst.Name) and value.value == 'True'
  }

  def is_true(test) -> bool | None:
    if isinstance(test, cst.Name) and (test.value == 'True' or test.value in constant):
      return True
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
      inner = is_true(test.expression)
      return None if inner is None else not inner
    return None

  class Flatten(cst.CSTTransformer):
    def leave_If(self, original, updated):
      value = is_true(updated.test)
      if value is None:
        return updated
      if value:
        block = list(updated.body.body)
      elif isinstance(updated.orelse, cst.Else):
        block = list(updated.orelse.body.body)
      elif updated.orelse is None:
        block = []
      else:  # an elif: kept as it is
        return updated
      if not block:
        return cst.RemoveFromParent()
      comments = [line for line in updated.leading_lines if line.comment is not None]
      block[0] = block[0].with_changes(leading_lines=[*comments, *block[0].leading_lines])
      return cst.FlattenSentinel(block)

  return method.visit(Flatten())


def reads(node: cst.CSTNode, exclude: cst.CSTNode) -> set[str]:
  """The names read anywhere in `node` but inside `exclude`'s targets."""
  found: set[str] = set()

  class Visitor(NameLoads):
    def visit_SimpleStatementLine(self, n):
      if n is exclude:
        exclude.body[0].value.visit(self)
        return False
      return True

    def visit_AssignTarget(self, n):
      if not _names(n.target):
        n.target.visit(self)
      return False

    def visit_Name(self, n):
      found.add(n.value)

  node.visit(Visitor())
  return found


_NO_SPACE = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(''), whitespace_after=cst.SimpleWhitespace('')
)


def tuple_source(items) -> str:
  """`items` (source texts) as a tuple's source: `(a,)`, `(a, b)`."""
  items = list(items)
  return f'({items[0]},)' if len(items) == 1 else '(' + ', '.join(items) + ')'


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
  """`name=value`, spaced as PEP 8 spaces keyword arguments."""
  return cst.Arg(value, keyword=cst.Name(name), equal=_NO_SPACE)


def keyword_value(call: cst.Call, name: str) -> cst.BaseExpression | None:
  """The value `call` gives its keyword `name`; None where it gives none."""
  return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def normalised(args: list[cst.Arg]) -> list[cst.Arg]:
  """Arguments with `, ` between them and no comma after the last (a
  multi-line call keeps its own layout)."""
  out = []
  for i, arg in enumerate(args):
    if i + 1 < len(args):
      comma = arg.comma if isinstance(arg.comma, cst.Comma) else cst.Comma(
          whitespace_after=cst.SimpleWhitespace(' ')
      )
    else:
      comma = cst.MaybeSentinel.DEFAULT
    out.append(arg.with_changes(comma=comma))
  return out


class CallsAmong(cst.CSTVisitor):
  """The creating calls inside a node, in source order."""

  def __init__(self, nodes):
    self.nodes, self.found = nodes, []

  def visit_Call(self, node):
    if node in self.nodes:
      self.found.append(node)


class DropSelfAssignments(cst.CSTTransformer):
  """Drops `x = x` (a running size that starts as the argument of its name;
  `config = self.config` once fields are arguments), and the `x` of
  `x, y = x, f(x)`."""

  def leave_SimpleStatementLine(self, original, updated):
    if len(updated.body) == 1 and isinstance(updated.body[0], cst.Assign):
      assign = updated.body[0]
      if len(assign.targets) != 1:
        return updated
      target, value = assign.targets[0].target, assign.value
      if isinstance(target, cst.Name) and isinstance(value, cst.Name) and target.value == value.value:
        return cst.RemoveFromParent()
      if (isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple)
          and len(target.elements) == len(value.elements)
          and not any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements))):
        kept = [
            (t.value, v.value) for t, v in zip(target.elements, value.elements)
            if not (isinstance(t.value, cst.Name) and isinstance(v.value, cst.Name)
                    and t.value.value == v.value.value)
        ]
        if not kept:
          return cst.RemoveFromParent()
        if len(kept) < len(target.elements):
          if len(kept) == 1:
            new_target, new_value = kept[0]
          else:
            new_target = cst.Tuple([cst.Element(t) for t, _ in kept], lpar=[], rpar=[])
            new_value = cst.Tuple([cst.Element(v) for _, v in kept], lpar=[], rpar=[])
          return updated.with_changes(body=[assign.with_changes(
              targets=[assign.targets[0].with_changes(target=new_target)], value=new_value)])
    return updated


class Substitute(cst.CSTTransformer):
  def __init__(self, table):
    self.table = table

  def leave_Name(self, original, updated):
    if updated.value in self.table:
      return expression(self.table[updated.value])
    return updated


class ReadAs(cst.CSTTransformer):
  """Each name read (not an attribute's, not a keyword's) as its expression
  in `table`, parenthesised unless atomic."""

  _ATOMIC = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Tuple, cst.List, cst.SimpleString,
             cst.Integer, cst.Float)

  def __init__(self, table: dict[str, cst.BaseExpression]):
    super().__init__()
    self.table = table

  def leave_Attribute(self, original, updated):
    return updated.with_changes(attr=original.attr)  # `a.b`: only `a` is read

  def leave_Arg(self, original, updated):
    return updated.with_changes(keyword=original.keyword)  # `f(k=v)`: `k` is not read

  def leave_Name(self, original, updated):
    value = self.table.get(original.value)
    if value is None:
      return updated
    if isinstance(value, self._ATOMIC) or value.lpar:
      return value
    return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class CallsWhere(cst.CSTVisitor):
  """Collects the calls for which `predicate` holds, in source order."""

  def __init__(self, predicate, found: list):
    self.predicate, self.found = predicate, found

  def visit_Call(self, node):
    if self.predicate(node):
      self.found.append(node)


def _line_break(indent: str) -> cst.ParenthesizedWhitespace:
  return cst.ParenthesizedWhitespace(
      first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True,
      last_line=cst.SimpleWhitespace(indent),
  )


class _Flatten(cst.CSTTransformer):
  """Every call's arguments on one line, `, ` between them."""

  def leave_Call(self, original, updated):
    args = [
        a.with_changes(whitespace_after_arg=cst.SimpleWhitespace(''), comma=cst.MaybeSentinel.DEFAULT)
        for a in updated.args
    ]
    return updated.with_changes(args=normalised(args), whitespace_before_args=cst.SimpleWhitespace(''))


class LaidOut(cst.CSTTransformer):
  """The statements of a method the port wrote (`__init__`), each call on
  one line where the line fits `limit` columns, else the outermost call's
  arguments one to a line, indented `continuation` past the statement."""

  def __init__(self, indent: str = '  ', continuation: str = '    ', limit: int = 100):
    self.indent, self.continuation, self.limit = indent, continuation, limit
    self.depth = 0

  def visit_IndentedBlock(self, node):
    self.depth += 1

  def leave_IndentedBlock(self, original, updated):
    self.depth -= 1
    return updated

  def leave_SimpleStatementLine(self, original, updated):
    flat = updated.visit(_Flatten())
    if len(self.indent) * self.depth + len(code_of(flat)) <= self.limit:
      return flat
    small = flat.body[0] if len(flat.body) == 1 else None
    value = getattr(small, 'value', None)
    if not isinstance(value, cst.Call) or not value.args:
      return flat
    args = [
        a.with_changes(comma=cst.Comma(whitespace_after=_line_break(
            self.continuation if i + 1 < len(value.args) else '')))
        for i, a in enumerate(value.args)
    ]
    laid = value.with_changes(args=args, whitespace_before_args=_line_break(self.continuation))
    return flat.with_changes(body=[small.with_changes(value=laid)])


_NEGATED = {cst.Is: cst.IsNot, cst.IsNot: cst.Is, cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal,
            cst.In: cst.NotIn, cst.NotIn: cst.In}


def negated(test: cst.BaseExpression) -> cst.BaseExpression:
  """`a is not None` of `a is None`, `not x` of `x`, `x` of `not x`,
  `not (...)` of anything else."""
  if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
    return test.expression
  if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
    (target,) = test.comparisons
    flip = _NEGATED.get(type(target.operator))
    if flip is not None:
      old = target.operator
      operator = flip(whitespace_before=old.whitespace_before, whitespace_after=old.whitespace_after) \
          if flip not in (cst.IsNot, cst.NotIn) else flip()
      return test.with_changes(comparisons=[target.with_changes(operator=operator)])
  if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
    return cst.UnaryOperation(cst.Not(), test)
  return cst.UnaryOperation(cst.Not(), test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))


def conjunction(first: cst.BaseExpression, second: cst.BaseExpression) -> cst.BaseExpression:
  """`first and second`, each parenthesised where `and` binds tighter."""
  def operand(test):
    if (isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or)
            or isinstance(test, (cst.IfExp, cst.Lambda, cst.NamedExpr))) and not test.lpar:
      return test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return test

  return cst.BooleanOperation(operand(first), cst.And(), operand(second))


def through_aliases(body: list[cst.BaseStatement], names: set[str]) -> list[cst.BaseStatement]:
  """`body` with `name.x` read as `alias.x` after a plain `alias = name`
  (for `name` in `names`): the sizes the port writes (`config.width`) in
  the spelling the code around them uses (`c = config`, then `c.width`)."""
  out, aliases = [], {}
  for statement in body:
    if aliases:
      statement = statement.visit(_Respell(aliases))
    out.append(statement)
    if (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1
        and isinstance(statement.body[0].targets[0].target, cst.Name)
        and isinstance(statement.body[0].value, cst.Name) and statement.body[0].value.value in names):
      aliases[statement.body[0].value.value] = statement.body[0].targets[0].target.value
  return out


class _Respell(cst.CSTTransformer):
  def __init__(self, aliases: dict[str, str]):
    self.aliases = aliases

  def leave_Attribute(self, original, updated):
    if isinstance(updated.value, cst.Name) and updated.value.value in self.aliases:
      return updated.with_changes(value=cst.Name(self.aliases[updated.value.value]))
    return updated


def bound_names(statement: cst.CSTNode) -> set[str]:
  """The names a statement binds at its own level (a module's, a class body's)."""
  if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
    return {statement.name.value}
  if isinstance(statement, cst.SimpleStatementLine):
    names = set()
    for small in statement.body:
      if isinstance(small, cst.Assign):
        for target in small.targets:
          names |= set(target_names(target.target))
      elif isinstance(small, cst.AnnAssign):
        names |= set(target_names(small.target))
      elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
        for alias in small.names:
          names.add(alias_name(alias))
    return names
  return set()


def alias_name(alias: cst.ImportAlias) -> str:
  """The name an import binds: `np` of `import numpy as np`, `jax` of `import jax.numpy`."""
  if alias.asname is not None:
    return alias.asname.name.value
  return cst.Module([]).code_for_node(alias.name).split('.')[0]


def descendants(node: cst.CSTNode) -> list[cst.CSTNode]:
  """`node` and every node below it."""
  found = []

  class Visitor(cst.CSTVisitor):
    def on_visit(self, n):
      found.append(n)
      return True

  node.visit(Visitor())
  return found


def bound_in(node: cst.CSTNode) -> set[str]:
  """Every name `node` (a function, a lambda, a body) binds anywhere in it:
  parameters, assignment, loop, `with`, `except` and comprehension targets,
  walrus targets, imports, nested definitions. A name bound anywhere in a
  function is its local throughout (over-counting a nested scope's only
  leaves such a name as written, which is safe)."""
  found: set[str] = set()

  class Visitor(cst.CSTVisitor):
    def on_visit(self, n) -> bool:
      if isinstance(n, _TARGETED):
        found.update(target_names(n.target))
      elif isinstance(n, cst.AsName):
        found.update(target_names(n.name))
      elif isinstance(n, (cst.Param, cst.FunctionDef, cst.ClassDef)):
        found.add(n.name.value)
      elif isinstance(n, cst.ImportAlias):
        found.add(alias_name(n))
      return True

  node.visit(Visitor())
  return found


#: The statements and clauses whose `target` binds names.
_TARGETED = (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr)
