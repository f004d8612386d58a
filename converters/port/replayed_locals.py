"""The locals of a compact method its port's `__init__` replays: those the
creations read, and what those read in turn (`kept`), each bound as in the
method, once, by a statement `__init__` replays (`check_bound_once`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import syntax

if TYPE_CHECKING:
  from converters.port.compact import CompactWriter


def kept(emitted: list[tuple[cst.BaseStatement, bool]]) -> list[cst.BaseStatement]:
  """The statements of a block of `__init__` (`(statement, is a candidate
  local)`, in order): all but the candidate locals that no statement kept
  reads, directly or through another local."""
  needed = set()
  for statement, candidate in emitted:
    if not candidate:
      needed |= syntax.names_in(statement)
  kept_ids = {id(s) for s, candidate in emitted if not candidate}
  changed = True
  while changed:
    changed = False
    for statement, candidate in emitted:
      if candidate and id(statement) not in kept_ids:
        targets = {n for s in statement.body for t in s.targets for n in syntax.target_names(t.target)}
        if targets & needed:
          kept_ids.add(id(statement))
          needed |= syntax.names_in(statement)
          changed = True
  return [s for s, _ in emitted if id(s) in kept_ids]


def check_bound_once(writer: CompactWriter, init_body: list[cst.BaseStatement]) -> None:
  """Every local `__init__` reads is bound as in the compact method: once,
  by a plain assignment or a loop that `__init__` replays. A local bound
  twice (`groups = 1; if self.grouped: groups = 4`), changed in place
  (`dims.append(...)`, `eps *= 10`) or bound in a block without creations
  (which `__init__` does not replay) is refused, not read half-computed."""
  read = set().union(*(syntax.names_in(s) for s in init_body)) if init_body else set()
  read -= syntax.names_bound_by(init_body, (cst.For,))  # bound in `__init__` by the loops it replays
  bindings = _Bindings()
  writer.method.body.visit(bindings)
  bound = bindings.bound
  creations = set(writer.node_sites) | set(writer.own) | set(writer.handed_variables)
  for name in read - set(writer.field_names) - {'self', 'rngs'}:
    places = bound.get(name, [])
    if not places:
      continue
    if len(places) > 1 or not _replayed(writer, places[0], creations):
      writer.fail(places[-1], f'{name!r} is computed in steps (bound more than once, changed in place, '
                  'or in a block that creates no module) and the layers read it; NNX builds them '
                  'in __init__, which the port cannot replay this with: port it by hand')
  for name, call in bindings.mutated:
    if name in read and name in bound:
      writer.fail(call, f'{name!r} is changed in place ({writer.file.code(call.func)}) and the layers '
                  'read it; port it by hand')


def _replayed(writer: CompactWriter, node: cst.CSTNode, creations: set) -> bool:
  """Whether `__init__` replays the statement `node`: each `if` and loop
  around it creates something (`creations`), and nothing else is."""
  for ancestor in writer.file.ancestors(node):
    if ancestor is writer.method:
      return True
    if isinstance(ancestor, (cst.If, cst.For)):
      finder = syntax.CallsAmong(creations)
      ancestor.visit(finder)
      if not finder.found:
        return False
    elif isinstance(ancestor, (cst.While, cst.With, cst.Try, cst.FunctionDef)):
      return False
  return True


class _Bindings(cst.CSTVisitor):
  """The statements binding each local (`bound`, twice for one changed in
  place, `x += 1`), and the method calls on locals (`mutated`: `(local,
  call)`, `dims.append(...)`)."""

  def __init__(self):
    self.bound: dict[str, list] = {}
    self.mutated: list[tuple[str, cst.Call]] = []

  def visit_Assign(self, node):
    for t in node.targets:
      for name in syntax.target_names(t.target):
        self.bound.setdefault(name, []).append(node)

  def visit_AugAssign(self, node):
    for name in syntax.target_names(node.target):
      self.bound.setdefault(name, []).extend([node, node])  # changed in place

  def visit_For(self, node):
    for name in syntax.target_names(node.target):
      self.bound.setdefault(name, []).append(node)

  def visit_Call(self, node):
    func = node.func
    if (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
        and func.value.value != 'self'):
      self.mutated.append((func.value.value, node))
