"""References to Flax Linen in code being ported, and their NNX spelling.

`nn.relu` is `nnx.relu`, `nn.initializers.zeros` is
`nnx.initializers.zeros`: the same objects, which a port may spell either
way; `nn.make_causal_mask` and `nnx.make_causal_mask` are two functions
compiled from the same code, as good. Anything else of Linen's (a layer class used as a value, Linen's
`Module` API on `self`) has no such spelling and is refused, or, in a helper
copied beside the classes, left with its import.
"""

from __future__ import annotations

import inspect
import types

import libcst as cst
from flax import linen as nn
from flax import nnx

from converters.port import linen_transforms, source, syntax
from converters.port.source import dotted  # noqa: F401 - where the port's modules read it
from converters.port.errors import Untranslatable

#: Linen `Module` methods and properties NNX modules do not have (or have
#: with another meaning): code calling them is not yet ported.
LINEN_MODULE_API = frozenset(
    n for n in dir(nn.Module) if not n.startswith('_') and n not in ('setup',)
)


def same_function(a, b, depth: int = 4) -> bool:
  """Whether `a` and `b` are the same object, or functions compiled from the
  same code (docstrings aside) that read the same globals: Flax defines some
  twice, once for each framework (`nn.make_causal_mask`,
  `nnx.make_causal_mask`)."""
  if a is b:
    return True
  if depth == 0 or not (inspect.isfunction(a) and inspect.isfunction(b)):
    return False
  if (a.__defaults__, a.__kwdefaults__) != (b.__defaults__, b.__kwdefaults__):
    return False
  if not _same_code(a.__code__, b.__code__, a.__doc__, b.__doc__):
    return False
  for name in a.__code__.co_names:
    if name in a.__globals__ or name in b.__globals__:
      x, y = a.__globals__.get(name, _MISSING), b.__globals__.get(name, _MISSING)
      if x is not y and not same_function(x, y, depth - 1):
        return False
  return True


def _same_code(a: types.CodeType, b: types.CodeType, doc_a=None, doc_b=None) -> bool:
  consts_a = [c for c in a.co_consts if not (doc_a is not None and c == doc_a)]
  consts_b = [c for c in b.co_consts if not (doc_b is not None and c == doc_b)]
  if (a.co_code, a.co_names, a.co_varnames, a.co_freevars, a.co_cellvars, a.co_argcount,
      a.co_kwonlyargcount) != (b.co_code, b.co_names, b.co_varnames, b.co_freevars,
                               b.co_cellvars, b.co_argcount, b.co_kwonlyargcount):
    return False
  if len(consts_a) != len(consts_b):
    return False
  for x, y in zip(consts_a, consts_b):
    if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
      if not _same_code(x, y, _code_doc(x), _code_doc(y)):
        return False
    elif type(x) is not type(y) or x != y:
      return False
  return True


def _code_doc(code: types.CodeType):
  first = code.co_consts[0] if code.co_consts else None
  return first if isinstance(first, str) else None


def _resolve(root, names: list[str]):
  for name in names:
    root = getattr(root, name, _MISSING)
    if root is _MISSING:
      return _MISSING
  return root


_MISSING = object()


#: Linen functions NNX spells otherwise: the NNX function, and its name for
#: each Linen parameter (by position: Linen's order).
RESPELLED = {
    nn.with_partitioning: ('nnx.with_partitioning', ('initializer', 'sharding', 'mesh')),
    nn.with_logical_partitioning: ('nnx.with_partitioning', ('initializer', 'sharding', 'mesh', 'sharding_rules')),
}
#: Linen functions whose NNX twin differs only in how it rejects bad input
#: (`nn.combine_masks` asserts the masks' ranks, `nnx.combine_masks` raises
#: ValueError): the same values for every input either accepts.
SAME_FOR_VALID_INPUTS = {nn.combine_masks: 'nnx.combine_masks'}
#: Linen functions of arrays, names and Python values alone, which NNX code
#: calls as they are (the rules come from the same `logical_axis_rules`
#: context; `merge_param` picks the one of a field and an argument given).
FRAMEWORK_FREE = frozenset({
    nn.with_logical_constraint, nn.logical_to_mesh_axes, nn.logical_to_mesh_sharding,
    nn.logical_to_mesh, nn.logical_axis_rules, nn.get_logical_axis_rules, nn.module.merge_param,
})


def _respelled(call: cst.Call, function) -> cst.Call:
  """`call` of Linen's `function` as NNX spells it."""
  nnx_name, nnx_parameters = RESPELLED[function]
  linen_parameters = list(inspect.signature(function).parameters)
  args = []
  for i, arg in enumerate(call.args):
    if arg.star:
      return call
    linen = arg.keyword.value if arg.keyword else linen_parameters[i]
    nnx_parameter = nnx_parameters[linen_parameters.index(linen)]
    positional = arg.keyword is None and nnx_parameter in ('initializer', 'sharding', 'mesh')
    args.append(arg if positional else syntax.keyword(nnx_parameter, arg.value))
  return cst.Call(syntax.expression(nnx_name), syntax.normalised(args))


class LinenReferences(cst.CSTTransformer):
  """`nn.relu` -> `nnx.relu`, `nn.initializers.zeros` -> `nnx.initializers.zeros`:
  each reference to Linen whose NNX spelling is the same object. Any other
  is refused (`strict`, in a class) or left (in a helper, which then keeps
  the Linen import)."""

  def __init__(self, file: source.SourceFile, cls: type | None, strict: bool = True, skip=(),
               bound=()):
    self.file, self.cls, self.strict, self.skip = file, cls, strict, set(skip)
    #: The names each enclosing function or lambda binds (`bound`: those of
    #: the function whose body is visited alone): a Linen name imported bare
    #: is not Linen's there (`def f(self, x, softmax=True): if softmax:`).
    self.scopes: list[set[str]] = [set(bound)]
    self.replaced: dict[cst.Attribute, cst.BaseExpression] = {}
    self.respelled: dict[cst.Call, object] = {}
    self.left: list[str] = []

  def on_visit(self, node) -> bool:
    return node not in self.skip and super().on_visit(node)

  def visit_Call(self, node):
    path = self.file.linen_path(node.func)
    if path is not None:
      function = _resolve(nn, path)
      if any(function is f for f in RESPELLED):
        self.respelled[node] = function
        self.skip.add(node.func)

  def leave_Call(self, original, updated):
    if original in self.respelled:
      return _respelled(updated, self.respelled[original])
    return updated

  def visit_Attribute(self, node):
    self.skip.add(node.attr)  # `x.relu`: not Linen's `relu` imported bare
    return self._visit_reference(node)

  def visit_Name(self, node):
    if any(node.value in scope for scope in self.scopes):
      return False  # bound here: the function's own, not Linen's
    return self._visit_reference(node)

  def visit_Arg(self, node):
    if node.keyword is not None:
      self.skip.add(node.keyword)

  def visit_Param(self, node):
    self.skip.add(node.name)

  def visit_FunctionDef(self, node):
    self.skip.add(node.name)
    self.scopes.append(syntax.bound_in(node))

  def leave_FunctionDef(self, original, updated):
    self.scopes.pop()
    return updated

  def visit_Lambda(self, node):
    self.scopes.append(syntax.bound_in(node))

  def leave_Lambda(self, original, updated):
    self.scopes.pop()
    return updated

  def _visit_reference(self, node) -> bool:
    path = self.file.linen_path(node)
    if not path:  # not Linen's, or `nn` itself (`getattr(nn, name)`)
      return True
    code = cst.Module([]).code_for_node(node)
    linen_object = _resolve(nn, path)
    twin = next((t for f, t in SAME_FOR_VALID_INPUTS.items() if f is linen_object), None)
    if path and linen_object is not _MISSING and same_function(linen_object, _resolve(nnx, path)):
      self.replaced[node] = syntax.expression('.'.join(('nnx',) + path))
    elif twin is not None:
      self.replaced[node] = syntax.expression(twin)
    elif any(linen_object is f for f in FRAMEWORK_FREE):
      self.left.append(code)  # kept, with Linen's import
    elif self.strict:
      line = self.file.positions[node].start.line if node in self.file.positions else None
      raise Untranslatable(
          self.cls, line,
          f'{code} is used beyond creating a layer, and NNX has no '
          f'nnx.{".".join(path)} that is the same; port it by hand',
      )
    else:
      self.left.append(code)
    return False

  def leave_Attribute(self, original, updated):
    return self.replaced.get(original, updated)

  def leave_Name(self, original, updated):
    return self.replaced.get(original, updated)


def linen_transform(node: cst.BaseExpression, file: source.SourceFile) -> str | None:
  """The name of the Linen lifted transform `node` is, called or not
  (`nn.remat(...)`, `nn.scan`), else None."""
  func = node.func if isinstance(node, cst.Call) else node
  return next((name for name in linen_transforms.NAMES if is_linen(func, file, name)), None)


def shared_scope(statement: cst.CSTNode, file: source.SourceFile) -> cst.Name | None:
  """The local of `nn.share_scope(self, local)` if `statement` is that alone
  (a module made in `local` keeping its variables in the class's own scope,
  Gemma's `FeedForward`), else None."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.Call)):
    return None
  call = statement.body[0].value
  if not is_linen(call.func, file, 'share_scope'):
    return None
  args = call.args
  if len(args) == 2 and all(a.keyword is None and a.star == '' and isinstance(a.value, cst.Name) for a in args) \
      and syntax.is_self(args[0].value):
    return args[1].value
  return None


def is_linen(node: cst.BaseExpression, file: source.SourceFile, *path: str) -> bool:
  """Whether `node` names Linen's `path` (`nn.compact`, or `compact`
  imported bare, for `is_linen(node, file, 'compact')`)."""
  return file.linen_path(node) == path
