"""One Linen class written with `@nn.compact`, rewritten as an NNX class.

Linen creates submodules where it calls them; NNX creates them in `__init__`
and calls them in `__call__`. From the compact method this writes both:

- `__init__` takes the Linen fields (same names, annotations and defaults),
  keeps them as attributes, and replays the part of the compact method that
  decides which modules exist: the loops and conditions around the creating
  expressions and the locals they read. Each creation becomes an NNX one,
  with the input size Linen inferred written as an expression of the fields
  and the inputs' shapes (`converters.port.shapes`), never as the traced
  number unless the source has it as a constant. Inputs whose sizes are
  needed become keyword arguments: `in_features` (the last axis of the only
  one needed) or `<argument>_shape`.
- `__call__` is the compact method with each creating expression replaced by
  the attribute holding the module: `self.dense_0`, or for modules created
  in a loop the loop over their `nnx.List` (`for conv in self.convs`).
- Flags the layers take from the call (`deterministic=not train`) become the
  NNX module's mode (`model.train()` / `model.eval()`): the argument leaves
  the signature when that is all it does.

What it cannot write it raises as `Untranslatable`, which the caller turns
into a marked stub.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence

import libcst as cst
from flax import nnx

from converters.port import (
  classes,
  conditions,
  layers,
  references,
  source,
  syntax,
  tracing,
  transforms,
  variables,
)
from converters.port.classes import ClassPort
from converters.port.errors import Untranslatable


def _compact_method(cdef: cst.ClassDef, file: source.SourceFile, cls: type) -> cst.FunctionDef:
  methods = [s for s in cdef.body.body if isinstance(s, cst.FunctionDef)]
  if any(m.name.value == 'setup' for m in methods):
    raise Untranslatable(cls, file.line_of(cdef), 'a module with setup(): not yet ported; port it by hand')
  compact = [
      m for m in methods
      if any(references.is_linen(d.decorator, file, 'compact') for d in m.decorators)
  ]
  if len(compact) != 1 or compact[0].name.value != '__call__':
    raise Untranslatable(
        cls, file.line_of(cdef),
        'only a module whose @nn.compact method is __call__ is ported yet; port it by hand',
    )
  return compact[0]


def _call_time_names(method: cst.FunctionDef, params: Sequence[str]) -> set[str]:
  """The arguments and every local computed from them (flow-insensitive)."""
  names = set(params)
  assignments: list[tuple[list[str], cst.CSTNode]] = []

  class Visitor(cst.CSTVisitor):
    def visit_Assign(self, n: cst.Assign):
      assignments.append(([x for t in n.targets for x in syntax.target_names(t.target)], n.value))

    def visit_AugAssign(self, n: cst.AugAssign):
      assignments.append((syntax.target_names(n.target), n))

    def visit_For(self, n: cst.For):
      assignments.append((syntax.target_names(n.target), n.iter))

    def visit_AnnAssign(self, n: cst.AnnAssign):
      if n.value is not None:
        assignments.append((syntax.target_names(n.target), n.value))

  method.body.visit(Visitor())
  changed = True
  while changed:
    changed = False
    for targets, value in assignments:
      if not set(targets) <= names and source.names_in(value) & names:
        names |= set(targets)
        changed = True
  return names


class CompactWriter(classes.ClassWriter):
  """Writes one class whose submodules its `@nn.compact` `__call__` creates."""

  writes_has_cache = True
  writes_draws = True
  keeps_factories = True
  writes_method_scan = True
  writes_shared_scopes = True
  writes_handed_functions = True

  def _methods(self) -> tuple[cst.FunctionDef, cst.FunctionDef]:
    method = _compact_method(self.cdef, self.file, self.cls)
    return method, method

  def _call_time(self) -> set[str]:
    return _call_time_names(self.method, self.params)

  def loops_around(self, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The loops around `node` inside the method, innermost first."""
    out = []
    for parent in self.file.ancestors(node):
      if parent is self.method:
        break
      if isinstance(parent, (cst.For, cst.While)):
        out.append(parent)
      if isinstance(parent, (cst.FunctionDef, cst.Lambda, cst.ListComp, cst.GeneratorExp)):
        self.fail(node, 'a module created in a nested function or comprehension; port it by hand')
    return out

  def _attributes(self) -> dict[tracing.Site, tuple[str, bool]]:
    taken: dict[str, object] = dict.fromkeys(set(self.field_names) | {'rngs'} | {
        m.name.value for m in self.cdef.body.body if isinstance(m, cst.FunctionDef)
    })
    attributes = {}
    for site, (node, children) in self.sites.items():
      if self.sequence_of(node) is not None:
        continue  # a Sequential's layer: held by it (`layers/0`), not by an attribute
      explicit = syntax.keyword_value(node, 'name')
      if site in self.helpers:
        helper = self.helpers[site]
        explicit = helper.argument(node, helper.name_parameter) if helper.name_parameter else None
      is_list = bool(self.loops_around(node)) or any(
          sum(c.parent is i for c in children) > 1 for i in self.instances
      )
      prefix = self._numbered_name(node, explicit, children) if explicit is not None and is_list else None
      if site in self.shared_scopes:
        if is_list:
          self.fail(node, 'nn.share_scope of modules made in a loop; port it by hand')
        # Its variables are the class's own in Linen (`mlp/linear`), in the
        # attribute named by the local in NNX (`mlp/linear/linear`).
        attribute = self.shared_scopes[site].local
      elif prefix is not None:
        attribute = prefix  # `name=f'block_{i}'` in a loop: the list `blocks`
      elif explicit is not None:
        if not isinstance(explicit, cst.SimpleString) or is_list:
          self.fail(node, 'a module named by an expression, or named in a loop; port it by hand')
        attribute = explicit.evaluated_value
        if not attribute.isidentifier():
          self.fail(node, f'name={attribute!r} is not a Python name; port it by hand')
      elif is_list:
        attribute = source.snake_case(children[0].cls.__name__) + 's'
        field = (references.dotted(self.partials.expanded(node).func) or [None, None])[1:]
        if len(field) == 1 and field[0] in self.field_names:
          # Made by what a field holds (`block_cls`): named after the field.
          attribute = source.snake_case(field[0].removesuffix('_cls').removesuffix('_class')) + 's'
        # The looped layers of a class that the other branch scans: one name.
        for other, (lift, local) in self.lifts.items():
          if (local is not None and self.sites[other][1][0].cls is children[0].cls
              and self._exclusive(node, self.sites[other][0])):
            attribute = local
      elif site in self.lifts and self.lifts[site][1] is not None:
        attribute = self.lifts[site][1]  # the local the transform was bound to: `blocks`
      elif site in self.lifts and self.lifts[site][0].scan:
        attribute = source.snake_case(children[0].cls.__name__) + 's'  # a stack of them
      else:
        attribute = self._auto_name(children)
      # Not a keyword (`class`), nor a name NNX modules or the class have
      # (`eval`, `train`, a method): the mapping records the name written.
      # Sites in the two branches of one `if` may share a name (the scanned
      # and the looped blocks), as only one of them exists.
      while (attribute in taken and not self._exclusive(node, taken[attribute])) or keyword.iskeyword(
          attribute) or hasattr(nnx.Module, attribute):
        attribute += '_'
      taken[attribute] = node
      attributes[site] = (attribute, is_list)
    return attributes

  def _auto_name(self, children) -> str:
    """The attribute of modules Linen names itself: `dense` for the class's
    one `Dense` (`Dense_0`, `CheckpointDense_0` under `nn.remat`), `dense_0`,
    `dense_1` where it makes several."""
    prefix = children[0].name.rpartition('_')[0]  # the class Linen names it by
    numbered = re.compile(rf'{re.escape(prefix)}_\d+')
    alone = all(c.name == f'{prefix}_0' for c in children) and not any(
        numbered.fullmatch(c.name) and c not in children for i in self.instances for c in i.children)
    name = source.snake_case(children[0].name)
    readable = source.snake_case(children[0].cls.__name__)
    if alone and not self._taken_name(readable):
      return readable
    return name

  def _taken_name(self, name: str) -> bool:
    """Whether `name` is a field, a keyword, NNX's, or bound in the class body
    (a method, a constant `dropout = 0.25` the methods read)."""
    return name in self.field_names or keyword.iskeyword(name) or hasattr(nnx.Module, name) or any(
        name in syntax.bound_names(s) for s in self.cdef.body.body)

  def _numbered_name(self, node, explicit, children) -> str | None:
    """The list's name for `name=f'block_{i}'` (`f'block{i + 1}'`) in a
    loop whose modules are named `block_0`, `block_1`, ... (`block1`,
    `block2`, ...) in order in every instance, each counting from one
    number (or none, a loop run no times): `blocks`. Else None."""
    if not (isinstance(explicit, cst.FormattedString) and len(explicit.parts) == 2
            and isinstance(explicit.parts[0], cst.FormattedStringText)
            and isinstance(explicit.parts[1], cst.FormattedStringExpression)
            and explicit.parts[1].format_spec is None and explicit.parts[1].conversion is None):
      return None
    text = explicit.parts[0].value
    prefix = text.removesuffix('_')
    if not prefix.isidentifier():
      return None
    for instance in self.instances:
      names = [c.name for c in children if c.parent is instance]
      if not names:
        continue  # a loop this instance ran no times
      first = names[0].removeprefix(text) if names[0].startswith(text) else ''
      if not first.isdigit() or names != [f'{text}{int(first) + k}' for k in range(len(names))]:
        return None
    name = source.snake_case(prefix)
    return name if name.endswith('s') else name + 's'

  def write(self) -> ClassPort:
    self.node_sites = {node: site for site, (node, _) in self.sites.items()}
    self.own = self._own_variables()
    if self.scans_call:
      self._check_scanned_call()
    init_body = self._init_block(list(self.method.body.body))
    self._check_locals_of_init(init_body)
    self._replayed = frozenset(syntax.code_of(s) for s in init_body if isinstance(s, cst.SimpleStatementLine))
    call = self._call_method()
    return self._assemble(init_body, {self.method: call})

  def _check_scanned_call(self) -> None:
    """What runs in `__call__` under Linen's scan over its inputs holds
    parameters only (broadcast: the same at every step) and draws nothing:
    NNX's scan of the method then runs the same program. Anything else
    (stacked or carried variables, keys split per step, modes) is refused."""
    if self.draws:
      self.fail(self.call, 'self.make_rng in a method Linen scans (keys per step): port it by hand')
    for node, children in self.sites.values():
      for child in children:
        spec = layers.layer_spec(child.cls)
        if spec is None or spec.mode or spec.module_fields:
          self.fail(node, f'{child.cls.__name__} created in a method Linen scans: only Flax\'s layers without '
                    'modes are written there (their parameters broadcast); port it by hand')
    for call, variable in self.own.items():
      if variable.collection != 'params':
        self.fail(call, f'a {variable.collection!r} variable in a method Linen scans; port it by hand')
    sows: list[cst.Call] = []
    self.method.body.visit(syntax.CallsWhere(variables.is_sow_call, sows))
    if sows:
      self.fail(sows[0], 'self.sow in a method Linen scans; port it by hand')

  def nnx_path(self, child: tracing.Created) -> tuple:
    """Where `child` (created by the traced instance) is in the port."""
    site = self.site_of(child)
    if site in self.inlined:
      return self.inlined_path(child)
    attribute, is_list = self.attributes[site]
    if not is_list:
      return (attribute,)
    siblings = [c for c in child.parent.children if self.site_of(c) == site]
    return (attribute, siblings.index(child))

  def _init_block(self, statements) -> list[cst.BaseStatement]:
    """The statements of `__init__` for a block of the compact method."""
    emitted: list[tuple[cst.BaseStatement, bool]] = []  # (statement, is a candidate local)
    for statement in statements:
      finder = syntax.CallsAmong({**self.node_sites, **self.own, **self.handed_variables})
      statement.visit(finder)
      if isinstance(statement, cst.For):
        inner = self._init_block(list(statement.body.body))
        if not inner:
          continue
        if self.call_time & source.names_in(statement.iter):
          self.fail(statement, 'a loop creating modules over values of the call; port it by hand')
        prelude = [
            syntax.statement(f'self.{self.attributes[site][0]} = nnx.List()\n')
            for site, (node, _) in self.sites.items()
            if site in self.attributes and self.attributes[site][1] and self.loops_around(node)[-1] is statement
        ]
        if id(statement) in self.sizes.running:
          initial, name = self.sizes.running[id(statement)]
          prelude.append(syntax.statement(f'{name} = {initial}\n'))
        loop = statement.with_changes(body=statement.body.with_changes(body=inner), orelse=None)
        emitted += [(s, False) for s in prelude] + [(loop, False)]
      elif isinstance(statement, cst.If):
        inner = self._init_block(list(statement.body.body))
        if statement.body in self.untraced_branches:
          inner = list(self.untraced_raise(statement.body).body)
        orelse = statement.orelse
        inner_else = []
        if orelse in self.untraced_branches:
          inner_else = list(self.untraced_raise(orelse).body)
        elif orelse is not None:
          block = orelse.body.body if isinstance(orelse, cst.Else) else [orelse]
          inner_else = self._init_block(list(block))
          if inner_else and not isinstance(orelse, cst.Else):
            self.fail(statement, 'modules created in an elif branch; port it by hand')
          if inner_else and self.call_time & source.names_in(statement.test):
            self.fail(statement, 'modules created in both branches of a condition on the call; port it by hand')
        if not inner and not inner_else:
          continue
        if not inner:
          # Modules made in the else branch only: the condition turned round.
          statement = statement.with_changes(test=syntax.negated(statement.test))
          inner, inner_else, orelse = inner_else, [], None
        test = statement.test
        leading = list(statement.leading_lines)
        if self.call_time & source.names_in(statement.test):
          # NNX decides which modules exist when it builds them: from the sizes.
          if self.loops_around(statement):
            self.fail(statement, f'modules created under a condition on the call '
                      f'({self.file.code(statement.test)}) in a loop; port it by hand')
          inside = {site for site, (node, _) in self.sites.items() if statement in self.file.ancestors(node)}
          test = syntax.expression(conditions.condition(self, statement, inside))
          leading.append(cst.EmptyLine(comment=cst.Comment(
              f'# Linen creates these when {self.file.code(statement.test)}: the same configurations.'
          )))
        if not inner_else and len(inner) == 1 and isinstance(inner[0], cst.If) and inner[0].orelse is None \
                and not inner[0].leading_lines:
          # `if a:` holding only `if b:` is `if a and b:` (as ruff's SIM102 asks).
          test, inner = syntax.conjunction(test, inner[0].test), list(inner[0].body.body)
        emitted.append((statement.with_changes(
            test=test, leading_lines=leading, body=statement.body.with_changes(body=inner),
            orelse=orelse.with_changes(body=orelse.body.with_changes(body=inner_else)) if inner_else else None,
        ), False))
      elif finder.found:
        if not isinstance(statement, cst.SimpleStatementLine):
          self.fail(statement, 'a module created in a statement the port does not handle; port it by hand')
        # A module made in place as the argument of a user's module
        # (`Encoder(emb=nn.Embed(11, 4))`) first: it is handed the attribute.
        # (A Flax layer's, an RNN's cell, is written inside its creation.)
        def argument_of_a_users_module(n) -> bool:
          outer = next((a for a in self.file.ancestors(n) if a in finder.found), None)
          return outer in self.node_sites and self.sites[self.node_sites[outer]][1][0].cls in self.child_ports

        found = sorted(finder.found, key=lambda n: not argument_of_a_users_module(n))
        for node in found:
          if node in self.node_sites and self.node_sites[node] in self.inlined:
            continue  # written inside the creation it is an argument of
          if node in self.own:
            emitted.append((cst.SimpleStatementLine([self.own[node].assignment()]), False))
            continue
          if node in self.handed_variables:
            for test, variable in self.handed_variables[node]:
              line = cst.SimpleStatementLine([variable.assignment()])
              emitted.append((line if test is None else cst.If(test, cst.IndentedBlock([line])), False))
            continue
          site = self.node_sites[node]
          attribute, is_list = self.attributes[site]
          creation = self.creations.creation(site)
          target = f'self.{attribute}'
          if site in self.lifts and self.lifts[site][0].scan:
            # A stack of layers, made by one vmapped function over split keys.
            function = transforms.creation(self.lifts[site][0], f'create_{attribute}', creation)
            emitted.append((function, False))
            creation = syntax.expression(f'create_{attribute}(rngs)')
          line = (
              cst.Expr(cst.Call(syntax.expression(f'{target}.append'), [cst.Arg(creation)]))
              if is_list else cst.Assign([cst.AssignTarget(syntax.expression(target))], creation)
          )
          emitted.append((cst.SimpleStatementLine([line]), False))
          update = self._running_update(node, site)
          if update is not None:
            emitted.append((update, False))
      elif (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign)
            and isinstance(statement.body[0].targets[0].target, cst.Name)
            and statement.body[0].targets[0].target.value in self.partials.kept
            and statement.body[0].value is self.factories.get(statement.body[0].targets[0].target.value)):
        # A partial handed on (`norm=norm`): NNX's, kept where Linen made it.
        name = statement.body[0].targets[0].target.value
        line = statement.body[0].with_changes(value=self.partials.nnx_factory(name))
        emitted.append((statement.with_changes(body=[line]), True))
      elif isinstance(statement, cst.SimpleStatementLine) and all(
          isinstance(s, cst.Assign) for s in statement.body
      ):
        targets = {n for s in statement.body for t in s.targets for n in syntax.target_names(t.target)}
        if targets and not targets & self.call_time and not classes.is_field_alias(statement, self.field_names):
          emitted.append((statement, True))
    # Locals the kept statements read, and what those read in turn.
    needed = set()
    for statement, candidate in emitted:
      if not candidate:
        needed |= source.names_in(statement)
    kept = {id(s) for s, candidate in emitted if not candidate}
    changed = True
    while changed:
      changed = False
      for statement, candidate in emitted:
        if candidate and id(statement) not in kept:
          targets = {n for s in statement.body for t in s.targets for n in syntax.target_names(t.target)}
          if targets & needed:
            kept.add(id(statement))
            needed |= source.names_in(statement)
            changed = True
    return [s for s, _ in emitted if id(s) in kept]

  def _read_outside(self, loop: cst.For) -> set[str]:
    """Names the compact method reads outside `loop` (a loop variable used
    after it keeps its name), but for another loop's own variables inside it."""
    found: set[str] = set()
    bound: list[set[str]] = []
    targets: set[cst.CSTNode] = set()

    class Visitor(cst.CSTVisitor):
      def visit_For(self, node):
        if node is loop:
          return False
        node.iter.visit(self)  # read before the loop binds its variable: `for i in range(i, 5)`
        targets.update(syntax.descendants(node.target))
        bound.append(source.names_in(node.target))
        node.body.visit(self)
        if node.orelse is not None:
          node.orelse.visit(self)
        bound.pop()
        return False

      def visit_Name(self, node):
        if node not in targets and not any(node.value in names for names in bound):
          found.add(node.value)

    self.method.body.visit(Visitor())
    return found - {'_'}  # `_` is never read

  def _check_locals_of_init(self, init_body) -> None:
    """Every local `__init__` reads is bound as in the compact method: once,
    by a plain assignment or a loop that `__init__` replays. A local bound
    twice (`groups = 1; if self.grouped: groups = 4`), changed in place
    (`dims.append(...)`, `eps *= 10`) or bound in a block without creations
    (which `__init__` does not replay) is refused, not read half-computed."""
    read = set().union(*(source.names_in(s) for s in init_body)) if init_body else set()
    # The targets of loops `__init__` replays are bound there, by those loops.
    targets: set[str] = set()

    class LoopTargets(cst.CSTVisitor):
      def visit_For(self, node):
        targets.update(syntax.target_names(node.target))

    for statement in init_body:
      statement.visit(LoopTargets())
    read -= targets
    bound: dict[str, list] = {}
    creations = set(self.node_sites) | set(self.own) | set(self.handed_variables)

    def replayed(node) -> bool:
      for ancestor in self.file.ancestors(node):
        if ancestor is self.method:
          return True
        if isinstance(ancestor, (cst.If, cst.For)):
          finder = syntax.CallsAmong(creations)
          ancestor.visit(finder)
          if not finder.found:
            return False
        elif isinstance(ancestor, (cst.While, cst.With, cst.Try, cst.FunctionDef)):
          return False
      return True

    writer = self

    class Bindings(cst.CSTVisitor):
      def visit_Assign(self, node):
        for t in node.targets:
          for name in syntax.target_names(t.target):
            bound.setdefault(name, []).append(node)

      def visit_AugAssign(self, node):
        for name in syntax.target_names(node.target):
          bound.setdefault(name, []).extend([node, node])  # changed in place

      def visit_For(self, node):
        for name in syntax.target_names(node.target):
          bound.setdefault(name, []).append(node)

      def visit_Call(self, node):
        func = node.func
        if (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
            and func.value.value != 'self'):
          writer._mutated.append((func.value.value, node))

    self._mutated: list = []
    self.method.body.visit(Bindings())
    fields = set(self.field_names)
    for name in read - fields - {'self', 'rngs'}:
      places = bound.get(name, [])
      if not places:
        continue
      if len(places) > 1 or not replayed(places[0]):
        self.fail(places[-1], f'{name!r} is computed in steps (bound more than once, changed in place, '
                  'or in a block that creates no module) and the layers read it; NNX builds them '
                  'in __init__, which the port cannot replay this with: port it by hand')
    for name, call in self._mutated:
      if name in read and name in bound:
        self.fail(call, f'{name!r} is changed in place ({self.file.code(call.func)}) and the layers '
                  'read it; port it by hand')

  def _lifted_call(self, original, updated, site, child, pending: list) -> cst.Call:
    """The call of a module Linen ran under `nn.scan` / `nn.remat`: a
    function under NNX's transforms (added to `pending`, written before the
    statement) applied to the carry and the stack."""
    lift, local = self.lifts[site]
    attribute = self.attributes[site][0]
    call = self.mode_flags.without_arguments(original, updated, child)
    args = list(call.args)
    if lift.scan and (not args or args[0].star or args[0].keyword is not None):
      self.fail(original, 'a scanned module called without its carry first; port it by hand')
    used = source.names_in(self.method)
    # A layer of the stack (`block` of `blocks`), or the module remat runs.
    module = attribute[:-1] if lift.scan and attribute.endswith('s') and len(attribute) > 1 else 'layer'
    while module in used:
      module += '_'
    name = local or f'run_{attribute}'
    stack = syntax.expression(f'self.{attribute}')
    if not lift.scan and not (args and not args[0].star and args[0].keyword is None
                              and args[0].value is updated.args[0].value and 1 not in lift.static_argnums):
      # Under remat alone, its inputs closed over: none passed, or the first
      # static (`static_argnums` counts the module: 1 is its first input).
      inner = cst.Call(cst.Name(module), syntax.normalised(args))
      pending.append(transforms.call_function(lift, name, '', module, inner))
      return cst.Call(cst.Name(name), [cst.Arg(call.func)])
    carry_value, rest = args[0].value, args[1:]
    if lift.scan and rest and not lift.broadcast:
      self.fail(original, 'nn.scan over the arguments after the carry (in_axes other than '
                'nn.broadcast): not written yet; port it by hand')
    carry = carry_value.value if isinstance(carry_value, cst.Name) else 'carry'
    if carry in set().union(*(source.names_in(a.value) for a in rest)) if rest else False:
      carry = 'carry'  # the other arguments read the name outside: keep them reading it
    while carry in used - ({carry_value.value} if isinstance(carry_value, cst.Name) else set()):
      carry += '_'
    inner = cst.Call(cst.Name(module), syntax.normalised([cst.Arg(cst.Name(carry)), *rest]))
    pending.append(transforms.call_function(lift, name, carry, module, inner))
    held = stack if lift.scan else call.func  # the module itself (a list's entry in a loop)
    return cst.Call(cst.Name(name), syntax.normalised([cst.Arg(carry_value), cst.Arg(held)]))

  def _running_update(self, node, site) -> cst.BaseStatement | None:
    """`in_size = <output size>` after a creation in a loop with a running size."""
    loops = self.loops_around(node)
    if not loops or id(loops[-1]) not in self.sizes.running:
      return None
    value = self.sizes.out_source(site)
    if value is None:
      self.fail(node, 'the output size of a module in the loop is not known; port it by hand')
    if not value:
      return None  # the size is unchanged
    update = syntax.statement(f'{self.sizes.running[id(loops[-1])][1]} = {value}\n')
    names = references.dotted(self.partials.expanded(node).func) or []
    if names[:1] == ['self'] and len(names) == 2 and names[1] in self.partials.fields:
      # What the field holds decides the size: written as the traced class makes it.
      made = self.sites[site][1][0].cls.__name__
      update = update.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
          f'# The output size {made} has (the {names[1]} traced): another class may differ.'))])
    return update

  def _call_method(self) -> cst.FunctionDef:
    """`__call__`: the compact method with modules read from attributes."""
    replacements: dict[cst.CSTNode, cst.CSTNode] = {}
    lists_by_loop: dict[int, list] = {}
    for site, (node, _) in self.sites.items():
      if site not in self.attributes:
        continue  # written inside the creation it is an argument of
      attribute, is_list = self.attributes[site]
      if not is_list:
        replacements[node] = syntax.expression(f'self.{attribute}')
        continue
      lists_by_loop.setdefault(id(self.loops_around(node)[0]), []).append((site, node))
    used = source.names_in(self.method)
    loop_rewrites: dict[int, tuple] = {}
    prelude: dict[int, list[str]] = {}
    for site, (node, _) in self.sites.items():
      attribute, is_list = self.attributes.get(site, (None, False))
      if not is_list:
        continue
      loops = self.loops_around(node)
      conditional = any(
          isinstance(a, cst.If) for a in syntax.between(self.file, node, loops[0])
      )
      simple = (
          len(loops) == 1 and isinstance(loops[0], cst.For)
          and len(lists_by_loop[id(loops[0])]) == 1 and not conditional
      )
      name = attribute[:-1] if attribute.endswith('s') else attribute + '_'
      while name in used:
        name += '_'
      used.add(name)
      if simple:
        replacements[node] = cst.Name(name)
        loop_rewrites[id(loops[0])] = (name, attribute)
      else:
        iterator = f'{attribute}_iter'
        while iterator in used:
          iterator += '_'
        used.add(iterator)
        replacements[node] = syntax.expression(f'next({iterator})')
        prelude.setdefault(id(loops[-1]), []).append(f'{iterator} = iter(self.{attribute})\n')
    writer = self

    factory_values = set(self.factories.values()) | set(self.lift_calls)
    shared = {shared.statement for shared in self.shared_scopes.values()}
    pending: list[cst.FunctionDef] = []  # functions the statement being rewritten calls

    class Rewrite(cst.CSTTransformer):
      def on_visit(self, node) -> bool:
        return node not in writer.untraced_branches and super().on_visit(node)

      def leave_If(self, original, updated):
        if original.body in writer.untraced_branches:
          updated = updated.with_changes(body=writer.untraced_raise(original.body))
        if original.orelse in writer.untraced_branches:
          updated = updated.with_changes(orelse=updated.orelse.with_changes(
              body=writer.untraced_raise(original.orelse)))
        return updated

      def leave_SimpleStatementLine(self, original, updated):
        # `norm = partial(nn.BatchNorm, ...)`, `blocks = nn.scan(...)`: their
        # creations are in __init__; `nn.share_scope(self, layer)`: only
        # Linen's paths, which `PATHS` maps.
        if original in shared:
          return cst.RemoveFromParent()
        if any(isinstance(s, cst.Assign) and s.value in factory_values for s in original.body):
          return cst.RemoveFromParent()
        if pending:
          functions = [f.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) for f in pending]
          pending.clear()
          return cst.FlattenSentinel(functions + [updated.with_changes(
              leading_lines=[cst.EmptyLine(indent=False), *updated.leading_lines])])
        return updated

      def leave_Call(self, original, updated):
        if original in replacements:
          return replacements[original]
        if variables.is_has_cache_variable(original):
          return cst.Name('True')  # NNX made the cache in __init__
        if original in writer.own:
          return writer.own[original].read
        if variables.is_sow_call(original):
          return variables.sow(original, updated, writer)
        if classes.drawn_stream(original) is not None:
          return classes.draw(original)
        if original.func in writer.node_sites:
          site = writer.node_sites[original.func]
          child = writer.sites[site][1][0]
          if site in writer.lifts:
            return writer._lifted_call(original, updated, site, child, pending)
          return writer.mode_flags.without_arguments(original, updated, child)
        if (made := writer.creation_named(original.func)) is not None:
          # `block = Block(...)` then `block(x, deterministic)`: the module it names.
          site = writer.node_sites[made]
          if site not in writer.lifts:
            return writer.mode_flags.without_arguments(original, updated, writer.sites[site][1][0])
        return updated

      def leave_For(self, original, updated):
        if id(original) in loop_rewrites:
          name, attribute = loop_rewrites[id(original)]
          targets = source.names_in(updated.target) - {'_'}
          if targets & (source.names_in(updated.body) | writer._read_outside(original)):
            target = writer.file.code(original.target)
            if not isinstance(original.target, cst.Name):
              target = f'({target})'  # `for (i, width), layer in zip(...)`
            updated = updated.with_changes(
                target=syntax.expression(f'({target}, {name})').with_changes(lpar=[], rpar=[]),
                iter=cst.Call(cst.Name('zip'), [
                    cst.Arg(updated.iter, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))),
                    cst.Arg(syntax.expression(f'self.{attribute}')),
                ]),
            )
          else:
            updated = updated.with_changes(target=cst.Name(name), iter=syntax.expression(f'self.{attribute}'))
        if id(original) in prelude:
          return cst.FlattenSentinel([syntax.statement(s) for s in prelude[id(original)]] + [updated])
        return updated

      def leave_Decorator(self, original, updated):
        if references.is_linen(original.decorator, writer.file, 'compact'):
          return cst.RemoveFromParent()
        if transforms.is_method_scan(original, writer.file):
          try:
            return transforms.method_scan(original, writer.method, writer.file)
          except transforms.Refused as e:
            writer.fail(original, f'{e}: not written yet; port it by hand')
        return updated

    method = self.method.visit(Rewrite())
    # Locals holding a variable (`index = self.variable(...)`) read it with `[...]`.
    holders = {
        name for name, value in self.locals.items()
        if value is not None and value in self.own and self.own[value].collection != 'params'
    }
    method = method.visit(variables.ValueReads(holders))
    # Mode flags leave the signature, with the locals that only served them.
    for flag in self.mode_flags.call:
      method = self.mode_flags.drop_flag(method, flag)
    # `has_variable('cache', ...)` is True in NNX: the branches it guarded, read plainly.
    method = syntax.without_constant_conditions(method)
    return syntax.without_leading_blank_lines(syntax.without_unused_locals(method, self._replayed | self.arguments.spread))


def port_class(cls, instances, symbolic_trace, child_ports, refused=None) -> ClassPort:
  """The NNX class of the Linen class `cls`, written from the instances the
  model made of it (`symbolic_trace(instance)` gives the sizes; `child_ports`
  are the ports of the user's classes it creates; `refused`, as
  `ClassWriter.refused`). Raises `Untranslatable`."""
  return CompactWriter(cls, instances, symbolic_trace, child_ports, refused).write()
