"""Linen's own Module API a class calls on `self`, as its port writes it:
`self.make_rng('noise')` as a draw from the `nnx.Rngs` the module keeps
(`self.rngs.noise()`), `self.has_variable('cache', ...)` where the writer
writes it (`writes_has_cache`), and the rest (`self.put_variable(...)`,
...) refused, the port not writing it yet. `self.param`, `self.variable`
and `self.sow` are written as the class's own variables
(`converters.port.variables`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import references, syntax, variables

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


#: Linen's Module API that reads or writes a module's variables or runs it
#: as a function: on a submodule (`self.dense.variables`, as Flax's
#: `mlp_lazy` example prints it in `setup()`), NNX has no counterpart.
SUBMODULE_STATE_API = frozenset({
    'variables', 'get_variable', 'has_variable', 'put_variable', 'param', 'variable', 'sow',
    'make_rng', 'is_initializing', 'is_mutable_collection', 'scope', 'apply', 'init',
    'init_with_output', 'lazy_init', 'bind', 'unbind', 'perturb',
}) & references.LINEN_MODULE_API


def drawn_streams(writer: ClassWriter) -> set[str]:
  """The streams the class draws from (`self.make_rng(stream)`), refusing
  the calls of Linen's Module API on `self` the port does not write, and
  draws in a module Linen runs under a lifted transform (its keys split
  per step)."""
  own = {s.name.value for s in writer.cdef.body.body if isinstance(s, cst.FunctionDef)}
  own |= set(writer.field_names) | {'param', 'variable', 'sow'}  # written by `variables`
  draws: set[str] = set()
  allowed = set()

  class Visitor(cst.CSTVisitor):
    def visit_Call(self, node):
      if writer.writes_has_cache and variables.is_has_cache_variable(node):
        allowed.add(node.func)
      stream = drawn_stream(node)
      if stream is not None and writer.writes_draws:
        if any(i.transform or i.lifted_methods for i in writer.instances):
          writer.fail(node, f'self.make_rng({stream!r}) in a module Linen runs under a lifted transform '
                      '(its keys split per step): not written yet; port it by hand')
        draws.add(stream)
        allowed.add(node.func)

    def visit_Attribute(self, node):
      if (syntax.is_self(node.value) and node not in allowed
          and node.attr.value in references.LINEN_MODULE_API and node.attr.value not in own):
        writer.fail(
            node,
            f'self.{node.attr.value}(...) is Linen\'s own Module API, which the port does not '
            'write yet; port it by hand',
        )
      held = syntax.self_attribute(node.value)
      if held is not None and held not in writer.field_names and node.attr.value in SUBMODULE_STATE_API:
        writer.fail(
            node,
            f'self.{held}.{node.attr.value} is Linen\'s Module API of a submodule, which an NNX '
            f'module does not have, and the port does not write it yet; in NNX a module\'s '
            f'variables are nnx.state(self.{held}) (a State, not Linen\'s collections)',
        )

  writer.cdef.visit(Visitor())
  return draws


class Draws(cst.CSTTransformer):
  """`self.make_rng('noise')` in a method of the class other than the one
  `__call__` is written from (a `token_drop` helper) as NNX draws it."""

  def leave_Call(self, original, updated):
    return draw(original) if drawn_stream(original) is not None else updated


def drawn_stream(node: cst.CSTNode) -> str | None:
  """`'noise'` of `self.make_rng('noise')` (a string the code spells out),
  else None."""
  if not (isinstance(node, cst.Call) and references.dotted(node.func) == ['self', 'make_rng']
          and len(node.args) == 1 and node.args[0].keyword in (None,)
          and isinstance(node.args[0].value, cst.SimpleString)):
    return None
  stream = node.args[0].value.evaluated_value
  return stream if isinstance(stream, str) and stream.isidentifier() and stream != 'params' else None


def draw(node: cst.Call) -> cst.Call:
  """`self.make_rng('noise')` as NNX draws it: `self.rngs.noise()`."""
  return cst.Call(syntax.expression(f'self.rngs.{drawn_stream(node)}'), [])
