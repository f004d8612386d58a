"""The variables a class makes itself, each claiming its attribute of the
port: the `self.param(...)` / `self.variable(...)` calls of its creating
method, and the parameters the file's functions it hands itself to make
through it (`converters.port.handed`: big_vision's `get_posemb(self, ...)`).
Those in a branch no configuration took are left to the branch, which
raises; those in a loop, or named as another attribute is, are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import branches, handed, syntax, variables

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter

#: The parameters a handed call makes: `(the test under which it does (None:
#: always), the variable, as one of the class's own)`.
HandedVariables = list[tuple[cst.BaseExpression | None, variables.OwnVariable]]


def handed_calls(writer: ClassWriter) -> dict[cst.Call, handed.HandedCall]:
  """The calls handing the module to a function of the file that makes
  parameters through it (big_vision's `get_posemb(self, ..., 'pos_embedding',
  ...)` calling `self.param`), written where the writer makes its own
  variables (`writes_handed_functions`); refused otherwise, or where the
  function does more through the module."""
  try:
    found = handed.handed_calls(writer.file, writer.cdef)
  except handed.Refused as e:
    writer.fail(e.node, str(e))
  for call in found:
    if not writer.writes_handed_functions or not any(call.call is n for n in syntax.descendants(writer.method)):
      writer.fail(call.call, f'{call.call.func.value}(...) is handed the module and calls {call.held}.param(...) '
                  'in it outside the compact method: NNX makes variables in __init__, which the function does '
                  'not say; write them in the class (self.param(...) there), or port it by hand')
  return {c.call: c for c in found}


def own_variables(writer: ClassWriter) -> tuple[dict[cst.Call, variables.OwnVariable],
                                                 dict[cst.Call, HandedVariables]]:
  """`self.param(...)` / `self.variable(...)` calls of the method, written,
  then the parameters each handed call makes (`writer.handed_calls`)."""
  found: list[cst.Call] = []
  writer.method.body.visit(syntax.CallsWhere(variables.is_own_variable_call, found))
  own = {}
  taken = {a for a, _ in writer.attributes.values()} | set(writer.field_names)
  made = {node for node, _ in writer.sites.values()} | set(writer.lift_calls)
  for call in found:
    # A variable of a branch no configuration took (`if self.pool_type ==
    # 'tok':`, its class token): that branch raises, as one making modules.
    if _in_untraced_branch(writer, call, made):
      continue
    if writer.loops_around(call):
      writer.fail(call, f'self.{call.func.attr.value}(...) in a loop; port it by hand')
    variable = variables.own_variable(call, writer)
    _claim(writer, variable, taken, call)
    own[call] = variable
  return own, _handed_variables(writer, taken, made)


def _handed_variables(writer: ClassWriter, taken: set[str], made: set) -> dict[cst.Call, HandedVariables]:
  """The parameters each handed call makes (`taken`: the attribute names
  so far; `made`: the creations the trace saw)."""
  found = {}
  for call, handed_call in writer.handed_calls.items():
    # In a branch no configuration took (`if self.use_pos:` never set).
    if _in_untraced_branch(writer, call, made):
      continue
    if writer.loops_around(call):
      writer.fail(call, f'{call.func.value}(...), handed the module, in a loop; port it by hand')
    written = []
    for through in handed_call.made:
      if through.test is not None and syntax.names_in(through.test) & writer.call_time:
        writer.fail(call, f'{call.func.value}(...) makes a parameter through the module when '
                    f'{syntax.code_of(through.test)}, which reads the call; port it by hand')
      variable = variables.own_variable(through.call, writer, where=call)
      _claim(writer, variable, taken, call)
      written.append((through.test, variable))
    found[call] = written
  return found


def _in_untraced_branch(writer: ClassWriter, call: cst.Call, made) -> bool:
  """Whether `call` is in a branch no configuration took (`made`: the
  creations the trace saw), which then raises, as one making modules (the
  branch added to `writer.untraced_branches`)."""
  branch = branches.untraced_branch(call, writer.method, writer.file, writer.instances, writer.call_time, made)
  if branch is not None:
    writer.untraced_branches[branch.block] = branch
    return True
  return any(b in writer.untraced_branches for b in writer.file.ancestors(call))


def _claim(writer: ClassWriter, variable: variables.OwnVariable, taken: set[str], call: cst.Call) -> None:
  """Adds the attribute names `variable` takes (each instance's, for one
  a field names) to `taken`, refusing one already taken."""
  names = {getattr(i.module, variable.named_by) for i in writer.instances} if variable.named_by else {variable.name}
  if names & taken:
    writer.fail(call, f'{sorted(names & taken)[0]!r} names both a variable and another attribute; port it by hand')
  taken |= names
