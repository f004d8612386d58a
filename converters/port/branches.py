"""Branches of a class's creating method that no traced configuration took.

A side of an `if` on the configuration alone (`if self.resnet is not None:`,
a hybrid ViT's ResNet root) that no traced instance takes, and that makes
only modules no trace made, cannot be written: the trace saw nothing of
it. The rest of the class can, so that side is written to raise
`NotImplementedError`, in `__init__` and in the call, and reported
(`stubs.UnportedBranch`); `untraced_branches` finds those of a class (and
refuses a creation anywhere else no trace went), `untraced_branch` one,
`UntracedBranch.raising` is what replaces it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import libcst as cst
from flax import linen as nn

from converters.port import helpers, references, source, syntax, tracing
from converters.port.errors import UntracedCreation

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


@dataclasses.dataclass(frozen=True)
class UntracedBranch:
  """`block`, the body of `statement` or its `else`, which no traced
  instance takes."""

  block: cst.BaseSuite | cst.Else
  statement: cst.If
  #: Why it is not written where a configuration the proof adds (a flag
  #: flipped, `scan=True`) takes it: what stopped the port there. None: no
  #: configuration traced takes it.
  refused: str | None = None

  @property
  def is_else(self) -> bool:
    return isinstance(self.block, cst.Else)

  def test(self, file: source.SourceFile) -> str:
    """The `if`'s test as the source writes it (`self.resnet is not None`)."""
    return file.code(self.statement.test)

  def line(self, file: source.SourceFile) -> int:
    return file.line_of(self.block if self.is_else else self.statement)

  def raising(self, class_name: str, file: source.SourceFile) -> cst.BaseSuite:
    """The block written to raise, saying why."""
    branch = 'else' if self.is_else else 'if'
    where = f'the {branch} branch of `if {file.code(self.statement.test)}`'
    message = (f'{class_name}: {where} was not traced, so the port does not write it: trace a '
               'configuration that takes it, or port it by hand') if self.refused is None else (
        f'{class_name}: {where} is not written: {self.refused}')
    body = self.block.body if self.is_else else self.block
    return body.with_changes(body=[syntax.statement(f'raise NotImplementedError({message!r})\n')])


def untraced_branch(node: cst.CSTNode, method: cst.FunctionDef, file: source.SourceFile,
                    instances: Sequence[tracing.Created], call_time: Collection[str],
                    made: Collection[cst.CSTNode]) -> UntracedBranch | None:
  """The side of the innermost `if` around `node` (in `method`) that tests
  the configuration only (no name of the call, `call_time`), makes nothing
  traced (`made`: the creations the trace saw) and that no traced instance
  takes; else None. An `if` whose test cannot be read for the traced
  instances (`if self.resnet.num_layers:` where `resnet` is None) hands on
  to the `if` around it: no instance went inside one never taken."""
  child = node
  for ancestor in file.ancestors(node):
    if ancestor is method:
      return None
    if isinstance(ancestor, cst.If) and child in (ancestor.body, ancestor.orelse):
      inside = syntax.descendants(child)
      if (not set(call_time) & syntax.names_in(ancestor.test) and not any(n in made for n in inside)
              and isinstance(child, (cst.IndentedBlock, cst.Else))
              and never_taken(ancestor, child is ancestor.body, file, instances)):
        return UntracedBranch(child, ancestor)
    child = ancestor
  return None


def taken_by(branch: UntracedBranch, file: source.SourceFile, instance: tracing.Created) -> bool:
  """Whether `instance` takes `branch` (False where its test cannot be read
  for it)."""
  value = _test_value(branch.statement, file, instance)
  return value is not _UNREAD and bool(value) != branch.is_else


_UNREAD = object()


def _test_value(statement: cst.If, file: source.SourceFile, instance: tracing.Created):
  """`statement`'s test read with `instance`'s module as `self`, in the
  file's globals; `_UNREAD` where it cannot be read so."""
  try:
    return eval(file.code(statement.test), vars(file.python_module),  # noqa: S307
                {'self': instance.module})
  except Exception:  # noqa: BLE001 - not a test of the configuration alone: not known
    return _UNREAD


def never_taken(statement: cst.If, body: bool, file: source.SourceFile,
                instances: Sequence[tracing.Created]) -> bool:
  """Whether no instance takes that side of `statement` (its test read
  with each instance's module as `self`, in the file's globals): a side
  taken that created nothing (a loop over none) is not untraced. False
  where the test cannot be read so."""
  for instance in instances:
    value = _test_value(statement, file, instance)
    if value is _UNREAD or bool(value) == body:
      return False
  return True


def untraced_branches(writer: ClassWriter) -> dict[cst.CSTNode, UntracedBranch]:
  """The branches of `writer`'s creating method that no traced instance
  takes and that create only what no trace made (a hybrid model's ResNet
  root, the trace without it), by their block: the port writes them to
  raise. A module class called anywhere else no trace went (a branch no
  configuration tried) is refused (`UntracedCreation`): it would stay a
  Linen creation."""
  made = {node for node, _ in writer.sites.values()} | set(writer.lift_calls)
  made |= {p for p in writer.factories.values()}
  module = writer.instance.module

  def module_class(func) -> bool:
    names = references.dotted(func)
    if names and names[0] == 'self' and len(names) == 2 and names[1] in writer.field_names:
      value = getattr(module, names[1], None)
    elif isinstance(func, cst.Name) and func.value in writer.factories:
      return True
    else:
      value = helpers.layer_class(writer.file, func)
    if isinstance(value, functools.partial):
      value = value.func
    return isinstance(value, type) and issubclass(value, nn.Module)

  untraced, transforms_of_modules = [], []

  class Visitor(cst.CSTVisitor):
    def visit_Call(self, node):
      if node in made:
        return
      if module_class(node.func):
        untraced.append(node)
      elif (references.linen_transform(node, writer.file) and node.args and module_class(node.args[0].value)
            and not any(a in made for a in writer.file.ancestors(node))):
        transforms_of_modules.append(node)  # `nn.remat(Block)`: untraced where a branch no one took holds it

  writer.method.body.visit(Visitor())
  found: dict[cst.CSTNode, UntracedBranch] = {}
  for node in transforms_of_modules:
    # (Elsewhere, one a creation reads through a local, the check of Linen's
    # names refuses it, saying what it is.)
    branch = untraced_branch(node, writer.method, writer.file, writer.instances, writer.call_time, made)
    if branch is not None:
      found[branch.block] = branch
  for node in untraced:
    branch = untraced_branch(node, writer.method, writer.file, writer.instances, writer.call_time, made)
    if branch is None:
      raise UntracedCreation(writer.cls, writer.file.line_of(node), (
          f'{writer.file.code(node.func)}(...) is created where no traced configuration went; port it by hand '
          '(or trace a configuration that takes it)'))
    found[branch.block] = branch
  for block, branch in list(found.items()):
    why = next((why for group, why in writer.refused
                if any(taken_by(branch, writer.file, instance) for instance in group)), None)
    if why is not None:
      found[block] = dataclasses.replace(branch, refused=why)
  return found


class RaisingUntracedBranches(cst.CSTTransformer):
  """A transformer of a writer's method that leaves the branches no
  configuration took unvisited and writes them to raise, saying so, rather
  than make the Linen modules written in them. Subclasses set `writer`."""

  writer: ClassWriter

  def on_visit(self, node) -> bool:
    return node not in self.writer.untraced_branches and super().on_visit(node)

  def leave_If(self, original, updated):
    writer = self.writer
    if original.body in writer.untraced_branches:
      updated = updated.with_changes(body=writer.untraced_raise(original.body))
    if original.orelse in writer.untraced_branches:
      updated = updated.with_changes(orelse=updated.orelse.with_changes(
          body=writer.untraced_raise(original.orelse)))
    return updated
