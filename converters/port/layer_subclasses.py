"""A user's subclass of a Flax layer, written as a subclass of the NNX layer.

`class StdConv(nn.Conv)` overriding `param` (vision_transformer's and
big_transfer's weight-standardised convolution) changes each parameter as the
layer reads it. An NNX layer reads its parameters in `__call__` and hands them
with its inputs to `promote_dtype` before anything else uses them, so the port
hands the override there: `_std_conv_param` is the Linen method's body, and
`StdConv(nnx.Conv)` gives nnx.Conv a `promote_dtype` that applies it first.
Where the layer masks its kernel (a Conv's `mask`), NNX masks before
`promote_dtype` and Linen after `param`: the written class refuses a mask.

The classes around the subclass build it as they build the layer
(`layers.layer_spec` gives the layer's spec for it); a subclass whose
override cannot be written is a stub of that same interface.
"""

from __future__ import annotations

import dataclasses
import textwrap

import libcst as cst

from converters.port import layers, source, syntax
from converters.port.errors import Untranslatable

#: The arrays each NNX layer hands `promote_dtype`, in order: its inputs,
#: then its parameters by their Linen names.
PROMOTED: dict[str, tuple[str, ...]] = {
    'nnx.Linear': ('inputs', 'kernel', 'bias'),
    'nnx.Conv': ('inputs', 'kernel', 'bias'),
    'nnx.ConvTranspose': ('inputs', 'kernel', 'bias'),
}


@dataclasses.dataclass(frozen=True)
class ParamOverride:
  """A Linen `param` override as plain data: the parameter holding the
  variable's name, the local the parent's value is bound to, and the
  statements that follow (which return what the layer reads)."""

  name: cst.Param
  value: str
  body: tuple[cst.BaseStatement, ...]


def _fail(cls: type, file: source.SourceFile, node: cst.CSTNode, message: str):
  raise Untranslatable(cls, file.line_of(node), message)


def read_override(cls: type, file: source.SourceFile) -> ParamOverride:
  """`cls`'s `param` as a `ParamOverride`. Raises `Untranslatable` where the
  class defines anything else, or `param` does more than change the value
  its parent returns (its first statement, `value = super().param(...)`)."""
  cdef = file.class_def(cls)
  methods = [s for s in cdef.body.body if isinstance(s, cst.FunctionDef)]
  others = [m for m in methods if m.name.value != 'param']
  if others or not methods:
    node = others[0] if others else cdef
    _fail(cls, file, node, f'a subclass of {cls.__mro__[1].__name__} is written where it overrides `param` '
          f'only; {cls.__name__} defines {", ".join(m.name.value for m in others) or "no `param`"}; '
          'port it by hand')
  (method,) = methods
  params = method.params
  if len(params.params) < 2 or params.params[0].name.value != 'self':
    _fail(cls, file, method, f'{cls.__name__}.param takes no name after self; port it by hand')
  name = params.params[1]
  first, *rest = method.body.body
  parent = _parent_value(first)
  if parent is None or not rest:
    _fail(cls, file, first, f'{cls.__name__}.param does not begin `value = super().param(...)` and then change '
          'the value; port it by hand')
  unread = {p.name.value for p in [*params.params[:1], *params.params[2:], *params.kwonly_params]}
  for star in (params.star_arg, params.star_kwarg):
    if isinstance(star, cst.Param):
      unread.add(star.name.value)
  read = set().union(*(syntax.names_in(s) for s in rest)) | _bare_names(rest)
  if read & (unread | {'super'}):
    _fail(cls, file, rest[0], f'{cls.__name__}.param reads {", ".join(sorted(read & (unread | {"super"})))} '
          'beyond the parameter\'s name and value; port it by hand')
  return ParamOverride(name.with_changes(default=None, equal=cst.MaybeSentinel.DEFAULT,
                                         comma=cst.MaybeSentinel.DEFAULT), parent, tuple(rest))


def _bare_names(statements) -> set[str]:
  found: set[str] = set()

  class Names(cst.CSTVisitor):
    def visit_Name(self, node: cst.Name):
      found.add(node.value)

  for statement in statements:
    statement.visit(Names())
  return found


def _parent_value(statement: cst.BaseStatement) -> str | None:
  """`value` of `value = super().param(...)`, else None."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(statement.body[0], cst.Assign)):
    return None
  assign = statement.body[0]
  if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
    return None
  call = assign.value
  if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == 'param'
          and isinstance(call.func.value, cst.Call) and isinstance(call.func.value.func, cst.Name)
          and call.func.value.func.value == 'super' and not call.func.value.args):
    return None
  return assign.targets[0].target.value


def class_source(cls: type, spec: layers.LayerSpec, file: source.SourceFile) -> str:
  """The NNX subclass of `cls` and the two functions it reads: the
  override's body (`_<name>_param`) and the `promote_dtype` applying it.
  Raises `Untranslatable` (`read_override`)."""
  arrays = PROMOTED.get(spec.nnx)
  if arrays is None:
    _fail(cls, file, file.class_def(cls), f'{spec.nnx} hands its parameters to no function the port can give '
          f'{cls.__name__}.param to; port it by hand')
  override = read_override(cls, file)
  prefix = '_' + source.snake_case(cls.__name__)
  docstring = cst.SimpleStatementLine([cst.Expr(cst.SimpleString(
      f'"""What Linen\'s {cls.__name__}.param did to each parameter the layer read."""'))])
  body = cst.IndentedBlock([docstring, *override.body])
  function = cst.FunctionDef(
      cst.Name(f'{prefix}_param'),
      cst.Parameters([override.name.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))),
                      cst.Param(cst.Name(override.value))]),
      body,
  )
  module = cst.Module([])
  parameters = [a for a in arrays if a != 'inputs']
  applied = ''.join(
      f'  {a} = {prefix}_param({a!r}, {a})\n' if a == 'kernel'
      else f'  {a} = None if {a} is None else {prefix}_param({a!r}, {a})\n'
      for a in parameters
  )
  layer = spec.nnx.removeprefix('nnx.')
  masked = 'mask' in spec.nnx_parameters()
  init = (
      '  def __init__(self, *args, mask=None, **kwargs):\n'
      '    if mask is not None:\n'
      f'      raise NotImplementedError({cls.__name__ + " changes the kernel after nnx." + layer + " masks it, where Linen changed it before: port the mask by hand"!r})\n'
      '    super().__init__(*args, promote_dtype=' + f'{prefix}_promote_dtype, **kwargs)\n'
      if masked else
      '  def __init__(self, *args, **kwargs):\n'
      f'    super().__init__(*args, promote_dtype={prefix}_promote_dtype, **kwargs)\n'
  )
  return (
      f'{module.code_for_node(function)}\n\n'
      f'def {prefix}_promote_dtype(arrays, dtype=None):\n'
      f'  """{spec.nnx}\'s promotion of {_tuple(arrays)}, each parameter first as\n'
      f'  Linen\'s {cls.__name__}.param had it."""\n'
      f'  {", ".join(arrays)} = arrays\n'
      f'{applied}'
      f'  return nnx.nn.dtypes.promote_dtype(({", ".join(arrays)}), dtype=dtype)\n\n\n'
      f'class {cls.__name__}({spec.nnx}):\n'
      f'  """{_first_line(cls)}\n\n'
      f'  Linen\'s `param` changed each parameter as the layer read it; {spec.nnx}\n'
      f'  hands its parameters to `promote_dtype` before it uses them, which\n'
      f'  changes them the same way ({prefix}_promote_dtype).\n  """\n\n'
      f'{init}'
  )


def _tuple(names) -> str:
  return '`(' + ', '.join(names) + ')`'


def _first_line(cls: type) -> str:
  """The first line of `cls`'s own docstring, else one naming it."""
  doc = (vars(cls).get('__doc__') or '').strip().splitlines()
  return doc[0].strip() if doc else f'{cls.__name__}, ported from Linen.'


def stub_source(cls: type, spec: layers.LayerSpec, reason: str) -> str:
  """The stub of a subclass whose override cannot be written: a subclass of
  the NNX layer (the classes around it build it so) that raises."""
  message = f'{cls.__name__} is a stub: {reason}'
  doc = textwrap.fill(
      f'STUB, not ported: {reason.removesuffix("; port it by hand")}. The classes around it build it as '
      f'{spec.nnx}; port the Linen class by hand keeping that.', 76, break_long_words=False,
  )
  return (
      f'class {cls.__name__}({spec.nnx}):\n'
      f'  """{textwrap.indent(doc, "  ").lstrip()}\n  """\n\n'
      '  def __init__(self, *args, **kwargs):\n'
      f'    raise NotImplementedError({message!r})\n'
  )
