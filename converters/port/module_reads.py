"""How a compact class's `__call__` reads the modules `__init__` made where
its compact method made them: the attribute (`self.dense`), a loop over the
list a loop made (`for conv in self.convs`, zipped with the loop's own
values where it reads them), or, where a loop makes several lists or makes
under a condition, the next module of an iterator over each list
(`next(convs_iter)`, the iterator made before the outermost loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import syntax

if TYPE_CHECKING:
  from converters.port.compact import CompactWriter


class ModuleReads:
  """The reads of one compact class's modules in its `__call__`."""

  def __init__(self, writer: CompactWriter):
    self.writer = writer
    #: Creating expression -> what `__call__` reads instead.
    self.replacements: dict[cst.CSTNode, cst.CSTNode] = {}
    #: `id` of a loop making one list -> `(the module's name, the list's
    #: attribute)`: the loop runs over the list.
    self.loops: dict[int, tuple[str, str]] = {}
    #: `id` of a loop -> the iterators over lists made before it.
    self.iterators: dict[int, list[str]] = {}
    lists_by_loop: dict[int, list] = {}
    for site, (node, _) in writer.sites.items():
      if site not in writer.attributes:
        continue  # written inside the creation it is an argument of
      attribute, is_list = writer.attributes[site]
      if not is_list:
        self.replacements[node] = syntax.expression(f'self.{attribute}')
        continue
      lists_by_loop.setdefault(id(writer.loops_around(node)[0]), []).append((site, node))
    self._read_lists(lists_by_loop)

  def _read_lists(self, lists_by_loop: dict[int, list]) -> None:
    """Each list's modules read by the loop making them, when it is the one
    loop making that list alone and unconditionally, else by an iterator."""
    writer = self.writer
    used = syntax.names_in(writer.method)
    for site, (node, _) in writer.sites.items():
      attribute, is_list = writer.attributes.get(site, (None, False))
      if not is_list:
        continue
      loops = writer.loops_around(node)
      conditional = any(  # (an `if` expression's side too: `dense(x) if self.out_dim else x`)
          isinstance(a, (cst.If, cst.IfExp)) for a in writer.file.ancestors_below(node, loops[0])
      )
      simple = (
          len(loops) == 1 and isinstance(loops[0], cst.For)
          and len(lists_by_loop[id(loops[0])]) == 1 and not conditional
      )
      name = attribute[:-1] if attribute.endswith('s') else attribute + '_'
      if name in used and 'layer' not in used:
        name = 'layer'  # (`block` is the function that runs it: `x = block(x, layer)`)
      while name in used:
        name += '_'
      used.add(name)
      if simple:
        self.replacements[node] = cst.Name(name)
        self.loops[id(loops[0])] = (name, attribute)
      else:
        iterator = f'{attribute}_iter'
        while iterator in used:
          iterator += '_'
        used.add(iterator)
        self.replacements[node] = syntax.expression(f'next({iterator})')
        self.iterators.setdefault(id(loops[-1]), []).append(f'{iterator} = iter(self.{attribute})\n')

  def loop(self, original: cst.For, updated: cst.For) -> cst.For | cst.FlattenSentinel:
    """The loop `original` (`updated`, its body rewritten) as `__call__`
    writes it: over the list it made, after the iterators it reads."""
    if id(original) in self.loops:
      name, attribute = self.loops[id(original)]
      targets = syntax.names_in(updated.target) - {'_'}
      if targets & (syntax.names_in(updated.body) | read_outside(self.writer.method, original)):
        target = self.writer.file.code(original.target)
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
    if id(original) in self.iterators:
      return cst.FlattenSentinel([syntax.statement(s) for s in self.iterators[id(original)]] + [updated])
    return updated


def read_outside(method: cst.FunctionDef, loop: cst.For) -> set[str]:
  """Names `method` reads outside `loop` (a loop variable used after it
  keeps its name), but for another loop's own variables inside it."""
  found: set[str] = set()
  bound: list[set[str]] = []
  targets: set[cst.CSTNode] = set()

  class Visitor(cst.CSTVisitor):
    def visit_For(self, node):
      if node is loop:
        return False
      node.iter.visit(self)  # read before the loop binds its variable: `for i in range(i, 5)`
      targets.update(syntax.descendants(node.target))
      bound.append(syntax.names_in(node.target))
      node.body.visit(self)
      if node.orelse is not None:
        node.orelse.visit(self)
      bound.pop()
      return False

    def visit_Name(self, node):
      if node not in targets and not any(node.value in names for names in bound):
        found.add(node.value)

  method.body.visit(Visitor())
  return found - {'_'}  # `_` is never read
