"""The sizes of the call's inputs a value reads, as `__init__` can read
them: `inputs.shape[-1]` written as the constructor's input size
(`in_features`), the locals it reads inlined; refused (None) where it reads
the call otherwise, or an input bound again before the read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import syntax

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


def without_input_reads(writer: ClassWriter, expression: cst.BaseExpression) -> cst.BaseExpression | None:
  """`expression` with the locals it reads inlined and every read of an
  input's size (`inputs.shape[-1]`) written as that size (`in_features`),
  so that `__init__` can compute it; None if it reads the call otherwise."""
  inputs = writer.symbolic.root.calls[0].args
  # An argument bound again in the method (`x = nn.Dense(...)(x)`) is not
  # the input any more where the shape is read: refused, not guessed.
  first_bound: dict[str, int] = {}  # argument -> the first line binding it again

  rebinding: dict[str, list] = {}  # argument -> the statements binding it again

  class Bindings(cst.CSTVisitor):
    def bind(self, node, target):
      for name in syntax.target_names(target):
        if name in writer.params and node in writer.file.positions:
          line = writer.file.positions[node].start.line
          first_bound[name] = min(first_bound.get(name, line), line)
          rebinding.setdefault(name, []).append(node)

    def visit_AssignTarget(self, node):
      self.bind(node, node.target)

    def visit_AnnAssign(self, node):  # `x: jax.Array = nn.Dense(w)(x)`
      self.bind(node, node.target)

    def visit_AugAssign(self, node):
      self.bind(node, node.target)

  writer.call.body.visit(Bindings())

  def rebound_before(name: str, node) -> bool:
    line = writer.file.positions[node].start.line if node in writer.file.positions else None
    if name in first_bound and (line is None or first_bound[name] <= line):
      return True
    # In a loop that binds it again, a later turn reads another value.
    loops = [a for a in writer.file.ancestors(node) if isinstance(a, (cst.For, cst.While))] if line else []
    return any(loop in writer.file.ancestors(b) for loop in loops for b in rebinding.get(name, ()))

  class Rewrite(cst.CSTTransformer):
    def leave_Subscript(self, original, updated):
      value = updated.value
      if (isinstance(value, cst.Attribute) and value.attr.value == 'shape'
          and isinstance(value.value, cst.Name) and value.value.value in writer.params
          and len(updated.slice) == 1 and isinstance(updated.slice[0].slice, cst.Index)):
        index = updated.slice[0].slice.value
        negative = isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.Minus)
        number = index.expression if negative else index
        position = writer.params.index(value.value.value)
        if rebound_before(value.value.value, original):
          return updated
        if isinstance(number, cst.Integer) and position < len(inputs) and hasattr(inputs[position], 'shape'):
          # The input's size: an argument of the constructor (`in_features`).
          ndim = len(inputs[position].shape)
          dim = ((-1 if negative else 1) * int(number.value)) % ndim
          writer.sizes.use_input_dim(position, dim)
          return cst.Name(f'__input_{position}_{dim}')
      return updated

    def visit_Attribute(self, node):
      attributes.add(node.attr)  # `self.out_dim`: not the local `out_dim`

    def leave_Name(self, original, updated):
      alias = writer.locals.get(updated.value)
      if original in attributes:
        return updated
      if updated.value in writer.call_time and alias is not None and updated.value not in writer.params:
        inlined = alias.visit(Rewrite())
        atomic = (cst.Name, cst.Tuple, cst.List, cst.Call, cst.Attribute, cst.Subscript, cst.Integer)
        return inlined if isinstance(inlined, atomic) else inlined.with_changes(
            lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
      return updated

  attributes: set[cst.Name] = set()
  rewritten = expression.visit(Rewrite())
  if syntax.names_in(rewritten) & writer.call_time:
    return None
  return rewritten
