"""A size an `if` on the configuration switches.

vit_jax's ViT adds a class token `if self.classifier in ['token',
'token_unpooled']`, so its encoder's sequence is one longer in those
configurations: the configurations the port traces (each value the source
switches on) give the encoder two input sizes. `switched_size` finds the
`if`, before the creation in the method, whose test takes one side for the
instances of one size and the other for the rest, and writes the size as
the source decides it: `h // p * (w // p) + 1 if classifier in ['token',
'token_unpooled'] else h // p * (w // p)`. A line assigning an `if`
expression decides as an `if` does (`x = jnp.concatenate([x, x], -1) if
self.merge == 'concat' else x`). No such `if`, or a test that reads more
than the fields, is refused by the caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

import libcst as cst

from converters.port import references, shapes, source, syntax, tracing


def switched_size(file: source.SourceFile, method: cst.FunctionDef, node: cst.CSTNode,
                  sizes: Mapping[str, Sequence[tracing.Created]], call_time: Collection[str],
                  fields: Collection[str], read: Collection[str] | None = None) -> str | None:
  """`<a> if <test> else <b>` for the two sizes `sizes` gives (size source
  -> the instances of the class that give it), where an `if` of `method`
  ending before `node` tests the configuration only and takes its body for
  the instances of `a` and not for those of `b` (or a line assigning an
  `if` expression so, `x = self.dense(x) if self.project else x`).

  `read`: the names the size is read from (`y` of `nn.Dense(y.shape[-1])`,
  `x` of `Encoder(...)(x)`; those the method binds), where known: the `if`
  written must change one of them, or one they are computed from (bind
  it, call a method on it, assign an item of it); one that changes none
  cannot switch the size, whatever its test parts, and is refused.

  None (the caller refuses) where there is no such `if`, where one
  instance gives both sizes (a loop), and where the `if` that decides is
  not known: two such `if`s with different tests (`if self.out_dim is not
  None:` and `if self.out_dim is not None and self.depth > 1:` part the
  traced instances alike; which one switches the size, the trace cannot
  tell, whichever of them changes what the size is read from), one inside
  a statement the creation is not in (an `if` nested in another, whose own
  test is not all that decides), or an `if` expression holding another."""
  if len(sizes) != 2:
    return None
  (first, first_instances), (second, second_instances) = sizes.items()
  if {id(i) for i in first_instances} & {id(i) for i in second_instances}:
    return None
  start = file.positions[node].start.line
  ancestors = set(file.ancestors(node))
  local = syntax.bound_in(method) - {'self'}
  read = set(read or ()) & local  # (none local, `Encoder()(self.table)`: not known)
  read = _flowing_into(read, method, file, start) & local if read else None
  found, changes_read = set(), read is None
  for statement in syntax.descendants(method):
    test = _deciding_test(statement)
    if (test is None or statement in ancestors
            or file.positions[statement].end.line >= start or set(call_time) & syntax.names_in(test)):
      continue
    taken = [test_value(file, test, i) for i in (*first_instances, *second_instances)]
    if None in taken:
      continue
    ones, others = taken[:len(first_instances)], taken[len(first_instances):]
    if len(set(ones)) == 1 and len(set(others)) == 1 and ones[0] != others[0]:
      written = init_test(test, file, fields)
      if (written is None or not _only_difference(test, (first_instances, second_instances), fields)
              or _nested(statement, method, file, ancestors) or _chooses_within(statement)):
        return None
      found.add(f'{first} if {written} else {second}' if ones[0] else f'{second} if {written} else {first}')
      changes_read = changes_read or bool(read & _changed_by(statement))
  # Every `if` parting them counts, changing the size's names or not: one
  # that seems not to may still (through a helper it hands them to), and
  # the trace cannot tell which test decides.
  return found.pop() if len(found) == 1 and changes_read else None


def _changed_by(statement: cst.CSTNode) -> set[str]:
  """The names `statement` binds or may change in place: those it calls a
  method on (`parts.append(...)`) or assigns an item or attribute of
  (`parts[0] = ...`)."""
  changed = syntax.bound_in(statement)
  for n in syntax.descendants(statement):
    base = _mutated(n)
    if base is not None:
      changed.add(base)
  return changed


def _mutated(node: cst.CSTNode) -> str | None:
  """The name `node` may change in place: `parts` of `parts.append(...)`,
  of a target `parts[0]` or `parts.first`; None for any other node."""
  if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
    target = node.func.value
  elif isinstance(node, (cst.AssignTarget, cst.AugAssign)) and isinstance(node.target, (cst.Subscript, cst.Attribute)):
    target = node.target.value
  else:
    return None
  while isinstance(target, (cst.Subscript, cst.Attribute)):
    target = target.value
  return target.value if isinstance(target, cst.Name) else None


def _chooses_within(statement: cst.CSTNode) -> bool:
  """Whether the `if` expression a line assigns holds another (`x if a
  else (y if b else z)`): its own test is not all that decides."""
  if not isinstance(statement, cst.SimpleStatementLine):
    return False
  choice = statement.body[0].value
  return any(isinstance(n, cst.IfExp) for part in (choice.body, choice.orelse) for n in syntax.descendants(part))


def _deciding_test(statement: cst.CSTNode) -> cst.BaseExpression | None:
  """The test of an `if`, or of the `if` expression a line assigns (`x =
  self.dense(x) if self.project else x`); None for any other node."""
  if isinstance(statement, cst.If):
    return statement.test
  if (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(statement.body[0], cst.Assign) and isinstance(statement.body[0].value, cst.IfExp)):
    return statement.body[0].value.test
  return None


_FLOWS = (cst.Assign, cst.Call, cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For, cst.CompFor, cst.WithItem)


def _flowing_into(names: set[str], method: cst.FunctionDef, file: source.SourceFile, line: int) -> set[str]:
  """`names` and every name an assignment of `method` before `line`
  computes one of them from (`y = embed(tokens) + e` makes `y` read
  `embed`, `tokens` and `e`), to a fixpoint: whatever order the
  assignments run in, more names than flow, never fewer."""
  flows: list[tuple[set[str], set[str]]] = []  # (bound, read) of each assignment
  for n in syntax.descendants(method):
    if not isinstance(n, _FLOWS) or file.positions[n].start.line >= line:
      continue
    if isinstance(n, cst.Assign):
      bound = {t for a in n.targets for t in syntax.target_names(a.target)}
      flows.append((bound | {b for a in n.targets if (b := _mutated(a)) is not None}, syntax.names_in(n.value)))
    elif isinstance(n, cst.Call):  # `parts.append(x * 2)`: `parts` now holds `x`
      if (base := _mutated(n)) is not None:
        flows.append(({base}, syntax.names_in(cst.Tuple([cst.Element(a.value) for a in n.args]))))
    elif isinstance(n, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr)) and n.value is not None:
      flows.append((set(syntax.target_names(n.target)), syntax.names_in(n.value)))
    elif isinstance(n, (cst.For, cst.CompFor)):
      flows.append((set(syntax.target_names(n.target)), syntax.names_in(n.iter)))
    elif isinstance(n, cst.WithItem) and n.asname is not None:
      flows.append((set(syntax.target_names(n.asname.name)), syntax.names_in(n.item)))
  grown = True
  while grown:
    grown = False
    for bound, reads in flows:
      if bound & names and not reads <= names:
        names |= reads
        grown = True
  return names


def _nested(statement: cst.If, method: cst.FunctionDef, file: source.SourceFile,
            shared: Collection[cst.CSTNode]) -> bool:
  """Whether `statement` is inside a compound statement of `method` (an
  `if`, a loop, a `try`) that is not one of `shared` (those around the
  creation too): its test alone does not say who takes it."""
  for ancestor in file.ancestors(statement):
    if ancestor is method:
      return False
    if isinstance(ancestor, (cst.If, cst.Else, cst.For, cst.While, cst.Try, cst.TryStar)) and ancestor not in shared:
      return True
  return False


def _only_difference(test: cst.BaseExpression, groups: Sequence[Sequence[tracing.Created]],
                     fields: Collection[str]) -> bool:
  """Whether no field `test` does not read parts the instances as `groups`
  do (each group one kind of value of it, beyond sizes, the groups two):
  else that field may be what switches the size (a width a field left None
  gives), and the test would be a guess."""
  read = {names[1] for node in syntax.descendants(test) if isinstance(node, cst.Attribute)
          and (names := references.dotted(node)) and names[0] == 'self' and len(names) >= 2}
  for field in fields:
    if field in read:
      continue
    kinds = [{_kind(getattr(i.module, field, None)) for i in group} for group in groups]
    if all(len(k) == 1 for k in kinds) and len(set.union(*kinds)) == len(groups):
      return False
  return True


def _kind(value) -> str:
  """`value` with its sizes left out, None kept: `shapes.beyond_sizes`, and
  whether each value is None (a field left None switches code too)."""
  if value is None:
    return 'None'
  if isinstance(value, int) and not isinstance(value, bool):
    return 'int'
  if isinstance(value, tuple) and not hasattr(value, '_fields'):
    return repr(tuple(_kind(v) for v in value))
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return repr(tuple(_kind(getattr(value, f.name)) for f in dataclasses.fields(value)))
  return repr(shapes.beyond_sizes(value))


def test_value(file: source.SourceFile, test: cst.BaseExpression, instance: tracing.Created) -> bool | None:
  """`test` read with `instance`'s module as `self`, in the file's globals;
  None where it cannot be read so."""
  try:
    return bool(eval(file.code(test), vars(file.python_module), {'self': instance.module}))  # noqa: S307
  except Exception:  # noqa: BLE001 - not a test of the configuration alone
    return None


def init_test(test: cst.BaseExpression, file: source.SourceFile, fields: Collection[str]) -> str | None:
  """`test` as `__init__` reads it, its fields by their argument names
  (`self.classifier in [...]` -> `classifier in [...]`); None where it
  reads `self` otherwise."""
  class Fields(cst.CSTTransformer):
    def leave_Attribute(self, original, updated):
      names = references.dotted(original)
      if names and names[0] == 'self' and len(names) >= 2 and names[1] in fields:
        rest = '.'.join(names[2:])
        return syntax.expression(names[1] + ('.' + rest if rest else ''))
      return updated

  rewritten = test.visit(Fields())
  return None if 'self' in syntax.names_in(rewritten) else cst.Module([]).code_for_node(rewritten)
