"""References to Flax Linen in code being ported, and their NNX spelling.

`nn.relu` is `nnx.relu`, `nn.initializers.zeros` is
`nnx.initializers.zeros`: the same objects, which a port may spell either
way. Anything else of Linen's (a layer class used as a value, Linen's
`Module` API on `self`) has no such spelling and is refused, or, in a helper
copied beside the classes, left with its import.
"""

from __future__ import annotations

import libcst as cst
from flax import linen as nn
from flax import nnx

from converters.port import source, syntax
from converters.port.errors import Untranslatable

#: Linen `Module` methods and properties NNX modules do not have (or have
#: with another meaning): code calling them is not yet ported.
LINEN_MODULE_API = frozenset(
    n for n in dir(nn.Module) if not n.startswith('_') and n not in ('setup',)
)


def dotted(node: cst.BaseExpression) -> list[str] | None:
  """`['nn', 'initializers', 'zeros']` of `nn.initializers.zeros`, or None."""
  if isinstance(node, cst.Name):
    return [node.value]
  if isinstance(node, cst.Attribute):
    head = dotted(node.value)
    return None if head is None else head + [node.attr.value]
  return None


def _resolve(root, names: list[str]):
  for name in names:
    root = getattr(root, name, _MISSING)
    if root is _MISSING:
      return _MISSING
  return root


_MISSING = object()


class LinenReferences(cst.CSTTransformer):
  """`nn.relu` -> `nnx.relu`, `nn.initializers.zeros` -> `nnx.initializers.zeros`:
  each reference to Linen whose NNX spelling is the same object. Any other
  is refused (`strict`, in a class) or left (in a helper, which then keeps
  the Linen import)."""

  def __init__(self, file: source.SourceFile, cls: type | None, strict: bool = True, skip=()):
    self.file, self.cls, self.strict, self.skip = file, cls, strict, set(skip)
    self.replaced: dict[cst.Attribute, cst.BaseExpression] = {}
    self.left: list[str] = []

  def visit_Attribute(self, node):
    names = dotted(node)
    if node in self.skip:
      return False
    if names is None or names[0] not in self.file.linen_names:
      return True
    linen_object = _resolve(nn, names[1:])
    if linen_object is not _MISSING and _resolve(nnx, names[1:]) is linen_object:
      self.replaced[node] = syntax.expression('.'.join(['nnx'] + names[1:]))
    elif self.strict:
      line = self.file.positions[node].start.line if node in self.file.positions else None
      raise Untranslatable(
          self.cls, line,
          f'{".".join(names)} is used beyond creating a layer, and NNX has no '
          f'nnx.{".".join(names[1:])} that is the same; port it by hand',
      )
    else:
      self.left.append('.'.join(names))
    return False

  def leave_Attribute(self, original, updated):
    return self.replaced.get(original, updated)


def is_linen(node: cst.BaseExpression, file: source.SourceFile, attribute: str) -> bool:
  return (
      isinstance(node, cst.Attribute)
      and isinstance(node.value, cst.Name)
      and node.value.value in file.linen_names
      and node.attr.value == attribute
  )
