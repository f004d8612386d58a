"""The attributes a compact class's port holds its modules in.

Linen names the modules a compact method makes where it makes them: the
name given (`name='encoder'`, `name=f'block_{i}'` in a loop), else the
class and a count (`Dense_0`). The port holds each site's modules in one
attribute: the name given, the list of a loop's (`blocks`), the local a
transform was bound to, or the class's own name (`dense`, `dense_0`),
never a keyword, a name NNX modules have, or one the class already binds.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst
from flax import nnx

from converters.port import references, source, syntax, tracing

if TYPE_CHECKING:
  from converters.port.compact import CompactWriter


class AttributeNames:
  """Names the attributes of one compact class's port, for its writer;
  `exclusive(node, other)`: whether two creations are in the two branches
  of one `if` (only one of them exists, so they may share a name)."""

  def __init__(self, writer: CompactWriter, exclusive: Callable[[cst.CSTNode, object], bool]):
    self.writer = writer
    self.exclusive = exclusive

  def attributes(self) -> dict[tracing.Site, tuple[str, bool]]:
    """Creation site -> `(attribute, is_list)`: where the modules made
    there live in the port."""
    writer = self.writer
    taken: dict[str, object] = dict.fromkeys(set(writer.field_names) | {'rngs'} | {
        m.name.value for m in writer.cdef.body.body if isinstance(m, cst.FunctionDef)
    })
    attributes = {}
    for site, (node, children) in writer.sites.items():
      if writer.sequence_of(node) is not None:
        continue  # a Sequential's layer: held by it (`layers/0`), not by an attribute
      is_list = bool(writer.loops_around(node)) or any(
          sum(c.parent is i for c in children) > 1 for i in writer.instances
      )
      attribute = self._attribute(site, node, children, is_list)
      # Not a keyword (`class`), nor a name NNX modules or the class have
      # (`eval`, `train`, a method): the mapping records the name written.
      # Sites in the two branches of one `if` may share a name (the scanned
      # and the looped blocks), as only one of them exists.
      while (attribute in taken and not self.exclusive(node, taken[attribute])) or keyword.iskeyword(
          attribute) or hasattr(nnx.Module, attribute):
        attribute += '_'
      taken[attribute] = node
      attributes[site] = (attribute, is_list)
    return attributes

  def _attribute(self, site, node, children, is_list: bool) -> str:
    """The attribute for the modules made at `site`, before it is made
    unique."""
    writer = self.writer
    explicit = syntax.keyword_value(node, 'name')
    if site in writer.helpers:
      helper = writer.helpers[site]
      explicit = helper.argument(node, helper.name_parameter) if helper.name_parameter else None
    prefix = self._numbered_name(explicit, children) if explicit is not None and is_list else None
    if site in writer.shared_scopes:
      if is_list:
        writer.fail(node, 'nn.share_scope of modules made in a loop; port it by hand')
      # Its variables are the class's own in Linen (`mlp/linear`), in the
      # attribute named by the local in NNX (`mlp/linear/linear`).
      return writer.shared_scopes[site].local
    if prefix is not None:
      return prefix  # `name=f'block_{i}'` in a loop: the list `blocks`
    if explicit is not None:
      if not isinstance(explicit, cst.SimpleString) or is_list:
        writer.fail(node, 'a module named by an expression, or named in a loop; port it by hand')
      attribute = explicit.evaluated_value
      if not attribute.isidentifier():
        writer.fail(node, f'name={attribute!r} is not a Python name; port it by hand')
      return attribute
    if is_list:
      return self._list_name(node, children)
    if site in writer.lifts and writer.lifts[site][1] is not None:
      return writer.lifts[site][1]  # the local the transform was bound to: `blocks`
    if site in writer.lifts and writer.lifts[site][0].scan:
      return source.snake_case(children[0].cls.__name__) + 's'  # a stack of them
    return self._auto_name(children)

  def _list_name(self, node, children) -> str:
    """The list of modules a loop makes, unnamed: after their class
    (`dense_blocks`), or the field making them (`block_cls`: `blocks`)."""
    writer = self.writer
    attribute = source.snake_case(children[0].cls.__name__) + 's'
    field = (references.dotted(writer.partials.expanded(node).func) or [None, None])[1:]
    if len(field) == 1 and field[0] in writer.field_names:
      attribute = source.snake_case(field[0].removesuffix('_cls').removesuffix('_class')) + 's'
    # The looped layers of a class that the other branch scans: one name.
    for other, (lift, local) in writer.lifts.items():
      if (local is not None and writer.sites[other][1][0].cls is children[0].cls
          and self.exclusive(node, writer.sites[other][0])):
        attribute = local
    return attribute

  def _auto_name(self, children) -> str:
    """The attribute of modules Linen names itself: `dense` for the class's
    one `Dense` (`Dense_0`, `CheckpointDense_0` under `nn.remat`), `dense_0`,
    `dense_1` where it makes several, `checkpoint_dense` for one under
    `nn.remat` beside a plain one."""
    prefix = children[0].name.rpartition('_')[0]  # the class Linen names it by
    numbered = re.compile(rf'{re.escape(prefix)}_\d+')
    alone = all(c.name == f'{prefix}_0' for c in children) and not any(
        numbered.fullmatch(c.name) and c not in children for i in self.writer.instances for c in i.children)
    name = source.snake_case(children[0].name)
    readable = source.snake_case(children[0].cls.__name__)
    if prefix != children[0].cls.__name__ and any(
        other[0].cls is children[0].cls for _, other in self.writer.sites.values() if other is not children):
      # Named by a transform's class (`CheckpointDense_0`) beside modules of
      # its own class: Linen's name says which it is (`checkpoint_dense`).
      readable = source.snake_case(prefix)
    if alone and not self._taken_name(readable):
      return readable
    return name

  def _taken_name(self, name: str) -> bool:
    """Whether `name` is a field, a keyword, NNX's, or bound in the class body
    (a method, a constant `dropout = 0.25` the methods read)."""
    writer = self.writer
    return name in writer.field_names or keyword.iskeyword(name) or hasattr(nnx.Module, name) or any(
        name in syntax.bound_names(s) for s in writer.cdef.body.body)

  def _numbered_name(self, explicit, children) -> str | None:
    """The list's name for `name=f'block_{i}'` (`f'block{i + 1}'`) in a
    loop whose modules are named `block_0`, `block_1`, ... (`block1`,
    `block2`, ...) in order in every instance, each counting from one
    number (or none, a loop run no times): `blocks`. Else None."""
    if not (isinstance(explicit, cst.FormattedString) and len(explicit.parts) == 2
            and isinstance(explicit.parts[0], cst.FormattedStringText)
            and isinstance(explicit.parts[1], cst.FormattedStringExpression)
            and explicit.parts[1].format_spec is None and explicit.parts[1].conversion is None):
      return None
    text = explicit.parts[0].value
    prefix = text.removesuffix('_')
    if not prefix.isidentifier():
      return None
    for instance in self.writer.instances:
      names = [c.name for c in children if c.parent is instance]
      if not names:
        continue  # a loop this instance ran no times
      first = names[0].removeprefix(text) if names[0].startswith(text) else ''
      if not first.isdigit() or names != [f'{text}{int(first) + k}' for k in range(len(names))]:
        return None
    name = source.snake_case(prefix)
    return name if name.endswith('s') else name + 's'
