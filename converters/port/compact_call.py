"""The `__call__` of a compact class's port: its compact method, each module
read from where `__init__` put it (`converters.port.module_reads`), each
call of one run as NNX's, its mode flags gone (`ModeFlags.without_arguments`)
or under NNX's transforms (`converters.port.lifted_calls`); what only made
modules (`norm = partial(nn.BatchNorm, ...)`) left to `__init__`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import (
  branches,
  lifted_calls,
  lifted_classes,
  linen_api,
  module_reads,
  references,
  source,
  syntax,
  variables,
)

if TYPE_CHECKING:
  from converters.port.compact import CompactWriter


def call_method(writer: CompactWriter, replayed: frozenset[str]) -> cst.FunctionDef:
  """`__call__`: the compact method with modules read from attributes
  (`replayed`: the statements `__init__` replays, as code, whose locals it
  keeps)."""
  method = writer.method.visit(_CallBody(writer, module_reads.ModuleReads(writer)))
  # Locals holding a variable (`index = self.variable(...)`) read it with `[...]`.
  holders = {
      name for name, value in writer.locals.items()
      if value is not None and value in writer.own and writer.own[value].collection != 'params'
  }
  method = method.visit(variables.ValueReads(holders))
  # Mode flags leave the signature, with the locals that only served them.
  for flag in writer.mode_flags.call:
    method = writer.mode_flags.drop_flag(method, flag)
  # Its remat numbers its static arguments in the signature left.
  method = method.with_changes(decorators=[
      _remat(writer, d, method) if lifted_classes.is_method_remat(d, writer.file) else d
      for d in method.decorators])
  # `has_variable('cache', ...)` is True in NNX: the branches it guarded, read plainly.
  method = syntax.without_constant_conditions(method)
  return syntax.without_leading_blank_lines(syntax.without_unused_locals(method, replayed | writer.arguments.spread))


def _remat(writer: CompactWriter, decorator: cst.Decorator, method: cst.FunctionDef) -> cst.Decorator:
  try:
    return lifted_classes.method_remat(decorator, writer.method, method)
  except lifted_classes.Refused as e:
    writer.fail(decorator, f'{e}: not written yet; {e.advice}')


class _CallBody(branches.RaisingUntracedBranches):
  """The compact method rewritten as `__call__`, but for its signature."""

  def __init__(self, writer: CompactWriter, reads: module_reads.ModuleReads):
    super().__init__()
    self.writer = writer
    self.reads = reads
    self.factory_values = set(writer.factories.values()) | set(writer.lift_calls)
    self.shared = {shared.statement for shared in writer.shared_scopes.values()}
    self.pending: list[cst.FunctionDef] = []  # functions the statement being rewritten calls
    # The loops around the statement being rewritten, outermost first, with
    # what each binds; the functions written before each, not in it.
    self.loops: list[tuple[cst.For, set[str]]] = []
    self.before_loop: dict[int, list[cst.FunctionDef]] = {}
    # The names of the functions written for the statements of each
    # outermost loop: written before it, they must differ.
    self.in_loop: dict[int, set[str]] = {}

  def leave_SimpleStatementLine(self, original, updated):
    # `norm = partial(nn.BatchNorm, ...)`, `blocks = nn.scan(...)`: their
    # creations are in __init__; `nn.share_scope(self, layer)`: only
    # Linen's paths, which `PATHS` maps.
    if original in self.shared:
      return cst.RemoveFromParent()
    if any(isinstance(s, cst.Assign) and s.value in self.factory_values for s in original.body):
      return cst.RemoveFromParent()
    if self.pending:
      functions = [f.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) for f in self.pending
                   if not self._hoisted(f)]
      self.pending.clear()
      if functions:
        return cst.FlattenSentinel(functions + [updated.with_changes(
            leading_lines=[cst.EmptyLine(indent=False), *updated.leading_lines])])
    return updated

  def _hoisted(self, function: cst.FunctionDef) -> bool:
    """Whether `function` is written before a loop around the statement
    (the outermost none of whose variables it reads), not at each turn."""
    read = source.free_names(function)
    outermost = len(self.loops)
    for k in range(len(self.loops) - 1, -1, -1):
      if read & self.loops[k][1]:
        break
      outermost = k
    if outermost == len(self.loops):
      return False
    self.before_loop[id(self.loops[outermost][0])].append(
        function.with_changes(leading_lines=[cst.EmptyLine(indent=False)]))
    return True

  def visit_For(self, node):
    self.loops.append((node, syntax.names_in(node.target) | syntax.bound_in(node.body)))
    self.before_loop[id(node)] = []

  def leave_Call(self, original, updated):
    writer = self.writer
    if original in self.reads.replacements:
      return self.reads.replacements[original]
    if variables.is_has_cache_variable(original):
      return cst.Name('True')  # NNX made the cache in __init__
    if original in writer.own:
      return writer.own[original].read
    if variables.is_sow_call(original):
      return variables.sow(original, updated, writer)
    if linen_api.drawn_stream(original) is not None:
      return linen_api.draw(original)
    if original.func in writer.node_sites:
      site = writer.node_sites[original.func]
      if site in writer.lifts:
        return self._pend(*lifted_calls.lifted_call(writer, original, updated, site))
      return writer.mode_flags.without_arguments(original, updated, writer.sites[site][1][0])
    if (made := writer.creation_named(original.func)) is not None:
      # `block = Block(...)` then `block(x, deterministic)`: the module it names.
      site = writer.node_sites[made]
      if site not in writer.lifts:
        return writer.mode_flags.without_arguments(original, updated, writer.sites[site][1][0])
      if not writer.lifts[site][0].scan:  # `b = nn.remat(Block)(...)`, then `b(x)`: under nnx.remat
        return self._pend(*lifted_calls.lifted_call(writer, original, updated, site))
    return updated

  def _pend(self, function: cst.FunctionDef, call: cst.Call) -> cst.Call:
    """`call`, `function` written before the statement: once where the
    statement calls it twice (`shared(shared(x) + 1)`), renamed where it
    calls another of that name."""
    for pending in self.pending:
      if syntax.code_of(pending) == syntax.code_of(function.with_changes(name=pending.name)):
        return call.with_changes(func=pending.name)
    name, taken = function.name.value, {f.name.value for f in self.pending}
    if self.loops:
      taken |= self.in_loop.setdefault(id(self.loops[0][0]), set())
    while name in taken:
      name += '_'
    if self.loops:
      self.in_loop[id(self.loops[0][0])].add(name)
    self.pending.append(function.with_changes(name=cst.Name(name)))
    return call.with_changes(func=cst.Name(name))

  def leave_For(self, original, updated):
    self.loops.pop()
    written = self.reads.loop(original, updated)
    functions = self.before_loop.pop(id(original))
    if not functions:
      return written
    statements = list(written.nodes) if isinstance(written, cst.FlattenSentinel) else [written]
    statements[0] = statements[0].with_changes(
        leading_lines=[cst.EmptyLine(indent=False), *statements[0].leading_lines])
    return cst.FlattenSentinel(functions + statements)

  def leave_Decorator(self, original, updated):
    writer = self.writer
    if references.is_linen(original.decorator, writer.file, 'compact'):
      return cst.RemoveFromParent()
    if lifted_classes.is_method_scan(original, writer.file):
      try:
        return lifted_classes.method_scan(original, writer.method, writer.file)
      except lifted_classes.Refused as e:
        writer.fail(original, f'{e}: not written yet; {e.advice}')
    return updated
