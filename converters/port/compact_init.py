"""The body of a compact class's `__init__`: the part of its compact method
that decides which modules exist, replayed with each creation NNX's.

Loops and conditions around creations are kept (a condition on the call
written as one on the sizes, `converters.port.conditions`), each creation
becomes an attribute (`self.dense = nnx.Linear(...)`, or an append to the
`nnx.List` of a loop's modules), and the locals the creations read are
replayed before them (`converters.port.replayed_locals`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import (
  classes,
  conditions,
  lifted_classes,
  references,
  replayed_locals,
  syntax,
)

if TYPE_CHECKING:
  from converters.port.compact import CompactWriter


class InitBody:
  """Writes `__init__`'s statements for the blocks of one compact method,
  for its writer."""

  def __init__(self, writer: CompactWriter):
    self.writer = writer

  def block(self, statements) -> list[cst.BaseStatement]:
    """The statements of `__init__` for a block of the compact method."""
    emitted: list[tuple[cst.BaseStatement, bool]] = []  # (statement, is a candidate local)
    for statement in statements:
      emitted += self._statement(statement)
    return replayed_locals.kept(emitted)

  def _statement(self, statement: cst.BaseStatement) -> list[tuple[cst.BaseStatement, bool]]:
    """What `__init__` replays of one statement: `(statement, is a candidate
    local)`, kept where the creations read it."""
    writer = self.writer
    finder = syntax.CallsAmong({**writer.node_sites, **writer.own, **writer.handed_variables})
    statement.visit(finder)
    if isinstance(statement, cst.For):
      return [(s, False) for s in self._loop(statement)]
    if isinstance(statement, cst.If):
      return [(s, False) for s in self._branch(statement)]
    if finder.found:
      if not isinstance(statement, cst.SimpleStatementLine):
        writer.fail(statement, 'a module created in a statement the port does not handle; port it by hand')
      return [(s, False) for s in self._creations(finder.found)]
    if self._hands_on_a_partial(statement):
      # A partial handed on (`norm=norm`): NNX's, kept where Linen made it.
      name = statement.body[0].targets[0].target.value
      line = statement.body[0].with_changes(value=writer.partials.nnx_factory(name))
      return [(statement.with_changes(body=[line]), True)]
    if isinstance(statement, cst.SimpleStatementLine) and all(isinstance(s, cst.Assign) for s in statement.body):
      targets = {n for s in statement.body for t in s.targets for n in syntax.target_names(t.target)}
      if targets and not targets & writer.call_time and not classes.is_field_alias(statement, writer.field_names):
        return [(statement, True)]
    return []

  def _hands_on_a_partial(self, statement: cst.BaseStatement) -> bool:
    """Whether `statement` binds a partial the method hands on, as made."""
    partials, factories = self.writer.partials, self.writer.factories
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign)
            and isinstance(statement.body[0].targets[0].target, cst.Name)
            and statement.body[0].targets[0].target.value in partials.kept
            and statement.body[0].value is factories.get(statement.body[0].targets[0].target.value))

  def _loop(self, statement: cst.For) -> list[cst.BaseStatement]:
    """A loop creating modules: its body replayed, after the `nnx.List`s
    it appends to and the running size it starts."""
    writer = self.writer
    inner = self.block(list(statement.body.body))
    if not inner:
      return []
    if writer.call_time & syntax.names_in(statement.iter):
      writer.fail(statement, 'a loop creating modules over values of the call; port it by hand')
    prelude = [
        syntax.statement(f'self.{writer.attributes[site][0]} = nnx.List()\n')
        for site, (node, _) in writer.sites.items()
        if site in writer.attributes and writer.attributes[site][1] and writer.loops_around(node)[-1] is statement
    ]
    if id(statement) in writer.sizes.running:
      initial, name = writer.sizes.running[id(statement)]
      prelude.append(syntax.statement(f'{name} = {initial}\n'))
    return prelude + [statement.with_changes(body=statement.body.with_changes(body=inner), orelse=None)]

  def _branch(self, statement: cst.If) -> list[cst.BaseStatement]:
    """An `if` creating modules: the branches that do, replayed."""
    writer = self.writer
    inner = self.block(list(statement.body.body))
    if statement.body in writer.untraced_branches:
      inner = list(writer.untraced_raise(statement.body).body)
    orelse = statement.orelse
    inner_else = self._else_block(statement)
    if not inner and not inner_else:
      return []
    if not inner:
      # Modules made in the else branch only: the condition turned round.
      statement = statement.with_changes(test=syntax.negated(statement.test))
      inner, inner_else, orelse = inner_else, [], None
    test, leading = self._test(statement)
    if not inner_else and len(inner) == 1 and isinstance(inner[0], cst.If) and inner[0].orelse is None \
            and not inner[0].leading_lines:
      # `if a:` holding only `if b:` is `if a and b:` (as ruff's SIM102 asks).
      test, inner = syntax.conjunction(test, inner[0].test), list(inner[0].body.body)
    return [statement.with_changes(
        test=test, leading_lines=leading, body=statement.body.with_changes(body=inner),
        orelse=orelse.with_changes(body=orelse.body.with_changes(body=inner_else)) if inner_else else None,
    )]

  def _else_block(self, statement: cst.If) -> list[cst.BaseStatement]:
    """The `else` of an `if` creating modules, replayed (none made: empty)."""
    writer = self.writer
    orelse = statement.orelse
    if orelse in writer.untraced_branches:
      return list(writer.untraced_raise(orelse).body)
    if orelse is None:
      return []
    block = orelse.body.body if isinstance(orelse, cst.Else) else [orelse]
    inner_else = self.block(list(block))
    if inner_else and not isinstance(orelse, cst.Else):
      writer.fail(statement, 'modules created in an elif branch; port it by hand')
    if inner_else and writer.call_time & syntax.names_in(statement.test):
      writer.fail(statement, 'modules created in both branches of a condition on the call; port it by hand')
    return inner_else

  def _test(self, statement: cst.If) -> tuple[cst.BaseExpression, list[cst.EmptyLine]]:
    """The condition `__init__` creates the modules under, and the lines
    before it: the method's own, or, on the call, one on the sizes."""
    writer = self.writer
    test = statement.test
    leading = list(statement.leading_lines)
    if writer.call_time & syntax.names_in(statement.test):
      # NNX decides which modules exist when it builds them: from the sizes.
      if writer.loops_around(statement):
        writer.fail(statement, f'modules created under a condition on the call '
                    f'({writer.file.code(statement.test)}) in a loop; port it by hand')
      inside = {site for site, (node, _) in writer.sites.items() if statement in writer.file.ancestors(node)}
      test = syntax.expression(conditions.condition(writer, statement, inside))
      leading.append(cst.EmptyLine(comment=cst.Comment(
          f'# Linen creates these when {writer.file.code(statement.test)}: the same configurations.'
      )))
    return test, leading

  def _creations(self, found: list[cst.Call]) -> list[cst.BaseStatement]:
    """The statements making the modules and variables a statement of the
    method creates (`found`, in source order)."""
    writer = self.writer

    # A module made in place as the argument of a user's module
    # (`Encoder(emb=nn.Embed(11, 4))`) first: it is handed the attribute.
    # (A Flax layer's, an RNN's cell, is written inside its creation.)
    def argument_of_a_users_module(n) -> bool:
      outer = next((a for a in writer.file.ancestors(n) if a in found), None)
      return outer in writer.node_sites and writer.sites[writer.node_sites[outer]][1][0].cls in writer.child_ports

    emitted = []
    for node in sorted(found, key=lambda n: not argument_of_a_users_module(n)):
      if node in writer.node_sites and writer.node_sites[node] in writer.inlined:
        continue  # written inside the creation it is an argument of
      if node in writer.own:
        emitted.append(cst.SimpleStatementLine([writer.own[node].assignment()]))
      elif node in writer.handed_variables:
        for test, variable in writer.handed_variables[node]:
          line = cst.SimpleStatementLine([variable.assignment()])
          emitted.append(line if test is None else cst.If(test, cst.IndentedBlock([line])))
      else:
        made = self._module(node, writer.node_sites[node])
        test = self._chosen_by(node)
        emitted += made if test is None else [cst.If(test, cst.IndentedBlock(made))]
    return emitted

  def _chosen_by(self, node: cst.Call) -> cst.BaseExpression | None:
    """The condition under which the `if` expressions of the configuration
    around `node` in its statement evaluate it (`x if self.out_dim is None
    else nn.Dense(self.out_dim)(x)`: `self.out_dim is not None`), as
    `__init__` creates it; None where none holds it, or one tests the call
    (a mode) or a name a loop around binds: the module is made in every
    configuration, as before."""
    writer = self.writer
    looped = set().union(*(syntax.bound_in(loop) for loop in writer.loops_around(node)))
    tests, child = [], node
    for ancestor in writer.file.ancestors(node):
      if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseStatement, cst.Lambda, cst.BaseComp)):
        break
      if isinstance(ancestor, cst.IfExp) and child is not ancestor.test:
        if (writer.call_time | looped) & syntax.names_in(ancestor.test):
          return None
        tests.insert(0, ancestor.test if child is ancestor.body else syntax.negated(ancestor.test))
      child = ancestor
    if not tests:
      return None
    test = tests[0]
    for other in tests[1:]:
      test = syntax.conjunction(test, other)
    return test

  def _module(self, node: cst.Call, site) -> list[cst.BaseStatement]:
    """The module (or list entry) made at `site`, and the running size
    after it."""
    writer = self.writer
    attribute, is_list = writer.attributes[site]
    creation = writer.creations.creation(site)
    target = f'self.{attribute}'
    emitted = []
    if site in writer.lifts and writer.lifts[site][0].scan:
      # A stack of layers, made by one vmapped function over split keys.
      emitted.append(lifted_classes.creation(writer.lifts[site][0], f'create_{attribute}', creation))
      creation = syntax.expression(f'create_{attribute}(rngs)')
    line = (
        cst.Expr(cst.Call(syntax.expression(f'{target}.append'), [cst.Arg(creation)]))
        if is_list else cst.Assign([cst.AssignTarget(syntax.expression(target))], creation)
    )
    emitted.append(cst.SimpleStatementLine([line]))
    update = self._running_update(node, site)
    if update is not None:
      emitted.append(update)
    return emitted

  def _running_update(self, node, site) -> cst.BaseStatement | None:
    """`in_size = <output size>` after a creation in a loop with a running size."""
    writer = self.writer
    loops = writer.loops_around(node)
    if not loops or id(loops[-1]) not in writer.sizes.running:
      return None
    value = writer.sizes.out_source(site)
    if value is None:
      writer.fail(node, 'the output size of a module in the loop is not known; port it by hand')
    if not value:
      return None  # the size is unchanged
    update = syntax.statement(f'{writer.sizes.running[id(loops[-1])][1]} = {value}\n')
    names = references.dotted(writer.partials.expanded(node).func) or []
    if names[:1] == ['self'] and len(names) == 2 and names[1] in writer.partials.fields:
      # What the field holds decides the size: written as the traced class makes it.
      made = writer.sites[site][1][0].cls.__name__
      update = update.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
          f'# The output size {made} has (the {names[1]} traced): another class may differ.'))])
    return update
