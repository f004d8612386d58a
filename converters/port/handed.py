"""Functions of the user's file handed the module, making its parameters
through it.

big_vision makes its position embedding in a function beside the classes:

    def get_posemb(self, typ, seqshape, width, name, dtype=jnp.float32):
      if typ == 'learn':
        return self.param(name, nn.initializers.normal(stddev=1/np.sqrt(width)),
                          (1, np.prod(seqshape), width), dtype)
      elif typ == 'sincos2d':
        return posemb_sincos_2d(*seqshape, width, dtype=dtype)

and calls it in `__call__`: `get_posemb(self, self.posemb, (h, w), c,
'pos_embedding', x.dtype)`. NNX makes parameters where it builds the module,
which the function does not say. The port reads each `self.param(...)` of
the function with the function's parameters bound to the call's arguments,
under the tests that lead to it (`MadeThrough`: `self.posemb == 'learn'`),
which the class's writer makes in `__init__` as one of its own; and writes
the function for NNX (`nnx_function`), each `self.param(name, ...)` read as
the attribute it made (`getattr(self, name)[...]`), called as Linen called
it.

Only `self.param` is written so: a function drawing keys, making other
variables or sowing through the module, reading it otherwise, making a
parameter in a loop or after a `return`, or from its own locals, is refused
(`Refused`), with what to write.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from converters.port import source, syntax

#: What a function may do with the module it is handed, beyond `param`,
#: that the port refuses (Linen's own API made through it).
_REFUSED_THROUGH = ('variable', 'make_rng', 'sow', 'put_variable', 'has_variable', 'is_initializing')


class Refused(Exception):
  """A handed function the port cannot write: the node and why."""

  def __init__(self, node: cst.CSTNode, message: str):
    self.node = node
    super().__init__(message)


@dataclasses.dataclass(frozen=True)
class MadeThrough:
  """One `self.param(...)` of a handed function, as one call makes it.

  Attributes:
    call: the `self.param(...)` call, the function's parameters replaced by
      the call's arguments (`self.param('pos_embedding', ...)`).
    test: when the function makes it, in the call's terms (`self.posemb ==
      'learn'`); None where it always does.
  """

  call: cst.Call
  test: cst.BaseExpression | None


@dataclasses.dataclass(frozen=True)
class HandedCall:
  """A call of the class's method handing the module to a function of the
  file (`call`), and the parameters the function makes through it."""

  call: cst.Call
  function: cst.FunctionDef
  held: str  # the function's parameter holding the module
  made: tuple[MadeThrough, ...]


def handed_calls(file: source.SourceFile, scope: cst.CSTNode) -> list[HandedCall]:
  """The calls in `scope` handing `self` to a function of `file` that makes
  variables through it, in source order. Raises `Refused`."""
  functions = {s.name.value: s for s in file.module.body if isinstance(s, cst.FunctionDef)}
  found = []
  for call in syntax.descendants(scope):
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in functions):
      continue
    function = functions[call.func.value]
    for held in _held(call, function):
      uses = _uses(function, held)
      if not uses:
        continue
      for use in uses:
        if not _is_param(use, held):
          what = use.attr.value if isinstance(use, cst.Attribute) else None
          raise Refused(call, f'{call.func.value}(...) is handed the module and '
                        + (f'calls {held}.{what}(...) in it' if what in _REFUSED_THROUGH else
                           f'reads {held} in it otherwise than by {held}.param(...)')
                        + ': NNX makes variables in __init__ (and draws keys from its Rngs), which the '
                        'function does not say; write them in the class (self.param(...) there), or port '
                        'it by hand')
      binding = _binding(call, function)
      made = tuple(m for param_call in _param_calls(function, held)
                   if (m := _made(file, call, function, param_call, binding)) is not None)
      found.append(HandedCall(call, function, held, made))
  return found


def nnx_function(function: cst.FunctionDef, held: str) -> cst.FunctionDef:
  """`function` for NNX: each `held.param(name, ...)` read as the parameter
  the module made in `__init__` (`held.name[...]` for a literal name,
  `getattr(held, name)[...]` for one the caller gives)."""

  class Reads(cst.CSTTransformer):
    def leave_Call(self, original, updated):
      if not _is_param_call(original, held):
        return updated
      name = original.args[0].value
      if isinstance(name, cst.SimpleString) and name.evaluated_value.isidentifier():
        attribute = syntax.expression(f'{held}.{name.evaluated_value}')
      else:
        attribute = cst.Call(cst.Name('getattr'), [cst.Arg(cst.Name(held)), cst.Arg(name)])
      return cst.Subscript(attribute, [cst.SubscriptElement(cst.Index(cst.Ellipsis()))])

  return function.visit(Reads())


def _held(call: cst.Call, function: cst.FunctionDef) -> list[str]:
  """The function's parameters `call` hands `self` to."""
  names = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
  held = []
  for i, arg in enumerate(call.args):
    if syntax.is_self(arg.value) and not arg.star:
      name = arg.keyword.value if arg.keyword is not None else (names[i] if i < len(names) else None)
      if name is None:
        raise Refused(call, f'{call.func.value}(...) is handed the module in its *args: port it by hand')
      held.append(name)
  return held


def _uses(function: cst.FunctionDef, held: str) -> list[cst.CSTNode]:
  """Every read of `held` in the function's body: the attribute read where
  it is one (`held.param`), else the name."""
  found = []

  class Visitor(cst.CSTVisitor):
    def visit_Attribute(self, node):
      if isinstance(node.value, cst.Name) and node.value.value == held:
        found.append(node)
        return False
      return True

    def visit_Name(self, node):
      if node.value == held:
        found.append(node)

  function.body.visit(Visitor())
  return found


def _is_param(use: cst.CSTNode, held: str) -> bool:
  return isinstance(use, cst.Attribute) and use.attr.value == 'param'


def _is_param_call(node: cst.CSTNode, held: str) -> bool:
  return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
          and isinstance(node.func.value, cst.Name) and node.func.value.value == held
          and node.func.attr.value == 'param')


def _param_calls(function: cst.FunctionDef, held: str) -> list[cst.Call]:
  return [n for n in syntax.descendants(function.body) if _is_param_call(n, held)]


def _binding(call: cst.Call, function: cst.FunctionDef) -> dict[str, cst.BaseExpression]:
  """The function's parameter -> the call's argument for it (its default
  where the call gives none)."""
  params = function.params
  if params.star_arg is not cst.MaybeSentinel.DEFAULT and not isinstance(params.star_arg, cst.ParamStar) \
     or params.star_kwarg is not None or params.posonly_params:
    raise Refused(call, f'{call.func.value}(...) takes *args, **kwargs or positional-only parameters and is '
                  'handed the module: port it by hand')
  named = [*params.params, *params.kwonly_params]
  bound: dict[str, cst.BaseExpression] = {}
  for i, arg in enumerate(call.args):
    if arg.star:
      raise Refused(call, f'{call.func.value}(...) is called with starred arguments and handed the module: '
                    'port it by hand')
    if arg.keyword is not None:
      bound[arg.keyword.value] = arg.value
    elif i < len(params.params):
      bound[params.params[i].name.value] = arg.value
  for param in named:
    if param.name.value not in bound and param.default is not None:
      bound[param.name.value] = param.default
  return bound


def _made(file: source.SourceFile, call: cst.Call, function: cst.FunctionDef, param_call: cst.Call,
          binding: dict[str, cst.BaseExpression]) -> MadeThrough | None:
  """`param_call` as `call` makes it: bound, and the tests leading to it;
  None where a test the call's literals decide never holds."""
  tests: list[cst.BaseExpression] = []
  child: cst.CSTNode = param_call
  for ancestor in file.ancestors(param_call):
    if ancestor is function:
      break
    if isinstance(ancestor, (cst.For, cst.While, cst.With, cst.Try, cst.Lambda, cst.FunctionDef, cst.Match,
                             cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp, cst.IfExp)):
      raise Refused(call, f'{call.func.value}(...) makes a parameter through the module inside a '
                    f'{type(ancestor).__name__.lower()} (line {file.line_of(param_call)}): port it by hand')
    if isinstance(ancestor, cst.If):
      if child is ancestor.body:
        tests.append(ancestor.test)
      elif child is ancestor.orelse:
        tests.append(syntax.negated(ancestor.test))
    if isinstance(ancestor, (cst.IndentedBlock, cst.Module)) and child in ancestor.body:
      before = ancestor.body[:list(ancestor.body).index(child)]
      if any(isinstance(n, (cst.Return, cst.Raise)) for s in before for n in syntax.descendants(s)):
        raise Refused(call, f'{call.func.value}(...) makes a parameter through the module after a return or '
                      f'raise (line {file.line_of(param_call)}): port it by hand')
    child = ancestor
  read = set().union(*(syntax.names_in(n) for n in [*tests, *param_call.args])) if tests or param_call.args else set()
  # A parameter the body binds again (`typ = typ.lower()`) is not the call's
  # argument any more: a local like any other.
  own_locals = syntax.bound_in(function.body)
  if read & own_locals:
    raise Refused(call, f'{call.func.value}(...) makes a parameter through the module from what it computes '
                  f'itself ({", ".join(sorted(read & own_locals))}): port it by hand')
  bind = syntax.ReadAs(binding)
  test = None
  for t in reversed(tests):  # outermost first
    t = t.visit(bind)
    constant = _constant(t)
    if constant is False:
      return None  # never made by this call (`get_posemb(self, 'sincos', ...)`)
    if constant is None:
      test = t if test is None else syntax.conjunction(test, t)
  return MadeThrough(param_call.visit(bind), test)


def _constant(test: cst.BaseExpression) -> bool | None:
  """The value of a test of literals only (`'learn' == 'learn'`, a call's
  literal argument bound in); None for one that reads a name."""
  if syntax.names_in(test):
    return None
  try:
    return bool(eval(syntax.code_of(test), {'__builtins__': {}}))  # noqa: S307 - literals only
  except Exception:  # noqa: BLE001 - not a constant after all
    return None
