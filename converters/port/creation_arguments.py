"""A creation's arguments as Linen gives them, each with the field it
sets: positional ones named, a dict spread into it (`**inits`, bound once to
`dict(kernel_init=...)`) read as its keywords, and a choice on the
configuration between two dicts (`**({'kernel_init': zeros} if zeroinit
else {})`) kept as the choice.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import libcst as cst

from converters.port import layers, syntax

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


class CreationArguments:
  """The creations' arguments of one class, for its `ClassWriter`."""

  def __init__(self, writer: ClassWriter):
    self.writer = writer
    self.file, self.fail = writer.file, writer.fail
    #: The code of statements binding a dict a creation spreads (`**inits`),
    #: which leave `__call__` with the creations.
    self.spread: set[str] = set()

  def of(self, node: cst.Call, cls: type) -> list[tuple[str, cst.Arg]]:
    """`(field, arg)` of a Linen creation's arguments, positional ones named."""
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    node = self.writer.partials.expanded(node)
    out = []
    for i, arg in enumerate(node.args):
      layer = layers.is_flax_class(cls) or layers.layer_spec(cls) is not None
      if arg.star == '**' and not layer and not self.writer.call_time & syntax.names_in(arg.value):
        # `Encoder(**self.transformer)`: a user's class takes its fields by
        # name in NNX too (`Creations._module` checks none is its mode).
        out.append(('**', arg))
        continue
      if arg.star == '**' and (named := self._named(arg.value)) is not None:
        out += [(a.keyword.value, a) for a in named]  # `**inits`, `inits = dict(kernel_init=...)`
        continue
      if arg.star == '**' and layer and (chosen := self._chosen(arg.value)) is not None:
        out.append(('**', arg.with_changes(value=chosen)))  # `kw = {...} if self.zeroinit else {}`
        continue
      if arg.star:
        self.fail(node, f'*args or **kwargs in the creation of {cls.__name__}; port it by hand')
      out.append((arg.keyword.value if arg.keyword else fields[i], arg))
    return out

  def _named(self, value: cst.BaseExpression) -> list[cst.Arg] | None:
    """The keyword arguments of a dict of names spread into a creation, as
    written (`{'kernel_init': ...}`), or held by a local the method binds
    once (`inits = dict(kernel_init=..., bias_init=...)`); else None."""
    bound = self._spread_binding(value)
    return None if bound is None else keyword_dict(bound)

  def _chosen(self, value: cst.BaseExpression) -> cst.IfExp | None:
    """A choice on the configuration between two dicts of names spread into
    a creation (`kw = {'kernel_init': nn.initializers.zeros} if
    self.writer.head_zeroinit else {}`, big_vision's head), written out or held by
    a local the method binds once: the choice, each side a dict literal of
    string keys; else None."""
    bound = self._spread_binding(value)
    if not isinstance(bound, cst.IfExp) or self.writer.call_time & syntax.names_in(bound.test):
      return None
    sides = [keyword_dict(bound.body), keyword_dict(bound.orelse)]
    if any(side is None for side in sides):
      return None
    body, orelse = (cst.Dict([cst.DictElement(cst.SimpleString(repr(a.keyword.value)), a.value) for a in side])
                    for side in sides)
    return bound.with_changes(body=body, orelse=orelse)

  def _spread_binding(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """What a `**value` spreads: the expression itself, or what the local it
    names is bound to once and read only where it is spread (whose
    statement then leaves `__call__`); None for a local read otherwise."""
    bound = self.writer.method_locals.get(value.value) if isinstance(value, cst.Name) else value
    if bound is not None and bound is not value:
      # Read only where it is spread: a dict changed after it is bound
      # (`inits['bias_init'] = ...`) is not what its binding says.
      reads = [n for n in syntax.descendants(self.writer.method) if isinstance(n, cst.Name) and n.value == value.value]
      spread = [a.value for a in syntax.descendants(self.writer.method) if isinstance(a, cst.Arg) and a.star == '**'
                and isinstance(a.value, cst.Name) and a.value.value == value.value]
      if len(reads) != len(spread) + 1:  # the spreads and the binding
        return None
      # Its statement may go from `__call__` once nothing else reads it.
      self.spread.update(syntax.code_of(n) for n in syntax.descendants(self.writer.method) if isinstance(
          n, cst.SimpleStatementLine) and any(isinstance(b, cst.Assign) and b.value is bound for b in n.body))
    return bound


def keyword_dict(node: cst.BaseExpression) -> list[cst.Arg] | None:
  """`dict(kernel_init=...)` or `{'kernel_init': ...}` (string keys that
  are names) as keyword arguments; else None."""
  if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == 'dict' and all(
      a.keyword is not None and not a.star for a in node.args):
    return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in node.args]
  if isinstance(node, cst.Dict) and all(
      isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
      and e.key.evaluated_value.isidentifier() for e in node.elements):
    return [syntax.keyword(e.key.evaluated_value, e.value) for e in node.elements]
  return None
