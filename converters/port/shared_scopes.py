"""Modules made to keep their variables in their creator's scope.

`nn.share_scope(self, gating)` after `gating = Einsum(...)` (Gemma's
`FeedForward`, kept so for checkpoints written before the layer existed)
makes Linen keep the layer's variables among the class's own
(`mlp/gating_einsum`). NNX has no shared scopes: the layer is the attribute
its local names (`self.gating`), and `PATHS` maps its variables from the
creator's scope (`mlp/gating_einsum` -> `mlp/gating/gating_einsum`). The
statement itself only says where Linen keeps the variables, so it is left
out of the port. `read` finds each such statement and the creation it
shares, as plain data; the class writers name the attribute and drop the
statement, `emit.path_pairs` maps the variables (`tracing.Created.reserved`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import libcst as cst

from converters.port import layers, references, source, tracing


@dataclasses.dataclass(frozen=True)
class SharedScope:
  """A creation whose modules share the class's scope: the local naming
  them and the `nn.share_scope(self, local)` statement."""

  local: str
  statement: cst.SimpleStatementLine


def read(method: cst.FunctionDef, file: source.SourceFile,
         sites: Mapping[tracing.Site, tuple[cst.Call, list[tracing.Created]]],
         exclusive: Callable[[cst.CSTNode, cst.CSTNode], bool],
         fail: Callable[[cst.CSTNode, str], None]) -> dict[tracing.Site, SharedScope]:
  """Site -> `SharedScope` for each `nn.share_scope(self, local)` of
  `method`, `local` bound (`local = Layer(...)`) by one creation the trace
  saw, or by one in each branch of an `if` (`exclusive`). Refused (`fail`):
  a local bound otherwise, a creation some configurations do not share, a
  Flax layer holding layers of its own."""
  bound: dict[str, list[tracing.Site]] = {}
  for site, (node, _) in sites.items():
    assign = next(file.ancestors(node), None)
    if (isinstance(assign, cst.Assign) and assign.value is node and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)):
      bound.setdefault(assign.targets[0].target.value, []).append(site)
  found: dict[tracing.Site, SharedScope] = {}

  class Visitor(cst.CSTVisitor):
    def visit_SimpleStatementLine(self, statement):
      local = references.shared_scope(statement, file)
      if local is None:
        return
      made = bound.get(local.value, [])
      if not made or any(s in found for s in made) or not all(
          exclusive(sites[a][0], sites[b][0]) for a in made for b in made if a != b):
        fail(statement, f'nn.share_scope(self, {local.value}) of a module not made once, by '
             f'`{local.value} = Layer(...)` in this method; port it by hand')
      for site in made:
        children = sites[site][1]
        if not all(c.shares_scope for c in children):
          fail(statement, f'nn.share_scope(self, {local.value}) where some configurations do not share its '
               'scope; port it by hand')
        if layers.is_flax_class(children[0].cls) and any(c.children for c in children):
          fail(statement, f'nn.share_scope(self, {local.value}) of Flax\'s {children[0].cls.__name__}, which '
               'holds layers of its own; port it by hand')
      found.update(dict.fromkeys(made, SharedScope(local.value, statement)))

  method.body.visit(Visitor())
  return found
