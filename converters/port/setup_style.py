"""One Linen class written with `setup()`, rewritten as an NNX class.

`setup` already does what NNX's `__init__` does: it assigns the submodules
to attributes. The port's `__init__` takes the Linen fields, keeps them, and
runs `setup`'s body with each Linen creation made an NNX one (the input size
Linen inferred at the module's first call written as an expression of the
fields and inputs, `converters.port.shapes`), a list of modules an
`nnx.List`, and `self.param` / `self.variable` NNX Variables. The other
methods stay as written, but for the arguments the NNX mode now sets
(`deterministic=not train` of a Dropout) and the reads of parameters
(`self.w` is `self.w[...]`).

Linen names a submodule by its attribute (`self.dense` is `dense`, the
entries of `self.layers` are `layers_0`, `layers_1`, ..., unless named, as
`name=f'layer_{i}'`): the port keeps the attribute, so the path mapping is
the identity but for the lists (`layers_0` -> `layers/0`, `layer_0` ->
`blocks/0`).
"""

from __future__ import annotations

import re

import libcst as cst

from converters.port import branches, classes, references, syntax, tracing, variables


class SetupWriter(classes.ClassWriter):
  """Writes one class whose submodules `setup` creates."""

  def _methods(self):
    methods = {s.name.value: s for s in self.cdef.body.body if isinstance(s, cst.FunctionDef)}
    if any(references.is_linen(d.decorator, self.file, 'compact') for m in methods.values() for d in m.decorators):
      self.fail(self.cdef, 'a module with both setup() and an @nn.compact method; port it by hand')
    called = '__call__' if '__call__' in methods else self.instance.calls[0].method if self.instance.calls else None
    if called not in methods:
      self.fail(self.cdef, 'a setup() module without __call__ nor a method the model calls; port it by hand')
    return methods['setup'], methods[called]

  def _call_time(self) -> set[str]:
    return set()  # `setup` reads no input

  def loops_around(self, node):
    for parent in self.file.ancestors(node):
      if parent is self.method:
        return []
      if isinstance(parent, (cst.For, cst.While, cst.FunctionDef, cst.Lambda)):
        self.fail(node, 'a module created in a loop or a nested function of setup(); port it by hand')
    return []

  def _attributes(self) -> dict[tracing.Site, tuple[str, bool]]:
    """`self.<attribute> = <creation>` (a scalar) or `= [<creations>]` (a list)."""
    attributes = {}
    for site, (node, children) in self.sites.items():
      self.loops_around(node)
      assign, is_list = self._assignment(node)
      attribute = assign.targets[0].target.attr.value
      if self.sequence_of(node) is not None:
        attributes[site] = (attribute, False)  # a Sequential's: written inside it, `body/layers/0`
        continue
      if is_list:
        # Linen names a list's modules `blocks_0`, `blocks_1`, ...; a name
        # given (`name=f'layer_{i}'`) counts as it says.
        self.numbering[site] = self._numbering(node, attribute, children)
      else:
        for child in children:
          if child.name != attribute:
            self.fail(node, f'{child.name} is assigned to self.{attribute}; port it by hand')
      attributes[site] = (attribute, is_list)
    return attributes

  def _numbering(self, node, attribute: str, children) -> tuple[str, int]:
    """`(prefix, first number)` of the names of a list's modules, the same
    in every instance, each made in order; else the class is refused.
    Linen's own names (`layers_0`, ...) count over the whole list, whatever
    made each entry."""
    if all(re.fullmatch(rf'{re.escape(attribute)}_\d+', c.name) for c in children):
      return f'{attribute}_', 0
    if sum(a == attribute and list_ for a, list_ in self._list_sites(node)) > 1:
      self.fail(node, f'self.{attribute} holds modules named by the code from several creations; port it by hand')
    found = set()
    for instance in self.instances:
      names = [c.name for c in children if c.parent is instance]
      matched = [re.fullmatch(r'(.*?)(\d+)', n) for n in names]
      if not names:
        continue
      if not all(matched) or len({m[1] for m in matched}) != 1 or [int(m[2]) for m in matched] != list(
          range(int(matched[0][2]), int(matched[0][2]) + len(names))):
        self.fail(node, f'{", ".join(names)} are assigned to self.{attribute}, named otherwise than in '
                  'order; port it by hand')
      found.add((matched[0][1], int(matched[0][2])))
    if len(found) != 1:
      self.fail(node, f'the modules of self.{attribute} are named otherwise in each instance; port it by hand')
    return found.pop()

  def _list_sites(self, node) -> list[tuple[str, bool]]:
    """`(attribute, is_list)` of every creation site of the method."""
    return [(a.targets[0].target.attr.value, is_list) for a, is_list in (
        self._assignment(n) for n, _ in self.sites.values() if self.sequence_of(n) is None)]

  def _assignment(self, node) -> tuple[cst.Assign, bool]:
    """The `self.x = ...` statement a creation is the value of, and whether
    it is an element of a list there."""
    parent = None
    is_list = False
    for ancestor in self.file.ancestors(node):
      if isinstance(ancestor, (cst.List, cst.Tuple, cst.ListComp)):
        is_list = True
      if isinstance(ancestor, cst.Assign):
        parent = ancestor
        break
    ok = (
        parent is not None and len(parent.targets) == 1
        and syntax.self_attribute(parent.targets[0].target) is not None
        and (parent.value is node or is_list)
    )
    if not ok:
      self.fail(node, 'a module created in setup() but not assigned to an attribute of self '
                '(directly or in a list); port it by hand')
    return parent, is_list

  def write(self):
    self.node_sites = {node: site for site, (node, _) in self.sites.items()}
    self.own = self._own_variables()
    for variable_call, variable in self.own.items():
      if variable.named_by is not None:
        self.fail(variable_call, f'a variable setup() names by the field {variable.named_by!r}; port it by hand')
      assign, _ = self._assignment_of(variable_call)
      attribute = assign.targets[0].target.attr.value
      if attribute != variable.name:
        # `self.input_embedding_table = self.param('input_embedding', ...)`:
        # NNX keeps the variable where the methods read it (`PATHS` renames).
        self.variable_attributes[variable.name] = attribute
    init_body = [s.visit(_SetupBody(self)) for s in self.method.body.body]
    init_body = [s for s in init_body if not _is_docstring(s)]
    methods = {}
    call_nodes = self._call_nodes()
    params = {self.variable_attributes.get(v.name, v.name) for v in self.own.values() if v.collection == 'params'}
    for statement in self.cdef.body.body:
      if isinstance(statement, cst.FunctionDef) and statement is not self.method:
        rewritten = statement.visit(_MethodBody(self, call_nodes, params))
        if statement is self.call:
          for flag in self.mode_flags.call:
            rewritten = self.mode_flags.drop_flag(rewritten, flag)
        methods[statement] = rewritten
    return self._assemble(init_body, methods)

  def _assignment_of(self, call):
    for ancestor in self.file.ancestors(call):
      if isinstance(ancestor, cst.Assign):
        target = ancestor.targets[0].target if len(ancestor.targets) == 1 else None
        if syntax.self_attribute(target) is not None and ancestor.value is call:
          return ancestor, False
        break
    self.fail(call, 'a variable made in setup() but not assigned to an attribute of self; '
              'port it by hand')

  def _call_nodes(self) -> dict[cst.Call, tracing.Created]:
    """The calls of the submodules, by their expression in the methods."""
    found = {}
    for _, children in self.sites.values():
      for child in children:
        for call in child.calls:
          node = self.file.call_at(call.site) if call.site else None
          if node is not None:
            found[node] = child
    return found


def _is_docstring(statement) -> bool:
  return (
      isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
      and isinstance(statement.body[0], cst.Expr)
      and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
  )


class _SetupBody(branches.RaisingUntracedBranches):
  """`setup`'s body as `__init__`'s: NNX creations, lists, Variables."""

  def __init__(self, writer: SetupWriter):
    self.writer = writer


  def leave_Call(self, original, updated):
    writer = self.writer
    if original in writer.node_sites:
      return writer.creations.creation(writer.node_sites[original])
    if original in writer.own:
      return writer.own[original].creation
    return updated

  def leave_Assign(self, original, updated):
    # A list of modules is an `nnx.List` (a list attribute would be data).
    if isinstance(original.value, (cst.List, cst.ListComp, cst.Tuple)) and any(
        self.writer.attributes[s][1] and n in syntax.descendants(original.value)
        for n, s in self.writer.node_sites.items()
    ):
      return updated.with_changes(value=cst.Call(syntax.expression('nnx.List'), [cst.Arg(updated.value)]))
    # `self.norm = None` before `if ...: self.norm = RMSNorm()`: NNX takes a
    # first value that is no module for a static attribute, which then
    # refuses the module; `nnx.data` says it is data.
    held = {attribute for attribute, _ in self.writer.attributes.values()}

    def holds_a_module(target) -> bool:
      return syntax.self_attribute(target) in held

    def data(value):
      is_none = isinstance(value, cst.Name) and value.value == 'None'
      return cst.Call(syntax.expression('nnx.data'), [cst.Arg(value)]) if is_none else value

    targets = [t.target for t in original.targets]
    if any(holds_a_module(t) for t in targets):  # `self.norm = None`, `self.pre = self.post = None`
      return updated.with_changes(value=data(updated.value))
    if (len(targets) == 1 and isinstance(targets[0], cst.Tuple) and isinstance(updated.value, cst.Tuple)
        and len(targets[0].elements) == len(updated.value.elements)):  # `self.pre, self.post = None, None`
      elements = [e.with_changes(value=data(e.value)) if holds_a_module(t.value) else e
                  for t, e in zip(targets[0].elements, updated.value.elements)]
      return updated.with_changes(value=updated.value.with_changes(elements=elements))
    return updated


class _MethodBody(cst.CSTTransformer):
  """A method as it stays: submodule calls without what the mode sets,
  parameters read with `[...]`, `sow` into `nnx.Intermediate`."""

  def __init__(self, writer: SetupWriter, call_nodes, params: set[str]):
    self.writer, self.call_nodes, self.params = writer, call_nodes, params

  def leave_Call(self, original, updated):
    if original in self.call_nodes:
      return self.writer.mode_flags.without_arguments(original, updated, self.call_nodes[original])
    if variables.is_sow_call(original):
      return variables.sow(original, updated, self.writer)
    return updated

  def leave_Attribute(self, original, updated):
    if syntax.self_attribute(updated) in self.params:
      return cst.Subscript(updated, [cst.SubscriptElement(cst.Index(cst.Ellipsis()))])
    return updated


def port_class(cls, instances, symbolic_trace, child_ports, refused=None) -> classes.ClassPort:
  """The NNX class of the Linen class `cls`, written from the instances the
  model made of it (`symbolic_trace(instance)` gives the sizes; `child_ports`
  are the ports of the user's classes it creates; `refused`, as
  `ClassWriter.refused`). Raises `Untranslatable`."""
  return SetupWriter(cls, instances, symbolic_trace, child_ports, refused).write()
