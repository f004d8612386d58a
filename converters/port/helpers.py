"""Functions of the user's file that make Flax layers, written to make NNX ones.

Real Linen code picks a layer in a function beside the classes:

    def _norm(config, name):
      if config.norm == 'rmsnorm':
        return nn.RMSNorm(name=name)
      return nn.LayerNorm(name=name)

and calls it in a method (`_norm(config, 'attention_norm')(x)`). The port
writes the function once, for every branch, as NNX builds layers:

    def _norm(config, *, num_features: int, rngs: nnx.Rngs):
      if config.norm == 'rmsnorm':
        return nnx.RMSNorm(num_features, rngs=rngs)
      return nnx.LayerNorm(num_features, rngs=rngs)

the input size Linen infers taken as a keyword argument (the call site
passes it, from the symbolic trace), a parameter used only as the layers'
`name=` dropped (its argument names the attribute instead), `rngs` added.
Only Flax layers the port knows are written; anything else in such a
function is refused.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from converters.port import layers, references, source, syntax
from converters.port.errors import Untranslatable


@dataclasses.dataclass
class HelperPort:
  """A function that makes layers, written for NNX.

  Attributes:
    node: the NNX function.
    parameters: its original positional-or-keyword parameters' names.
    dropped: parameters left out (only ever a layer's `name=`).
    name_parameter: the parameter naming the layers it makes, if any.
    size_parameter: the keyword-only parameter taking the input size, if
      a layer it makes needs one.
  """

  node: cst.FunctionDef
  parameters: list[str]
  dropped: set[str]
  name_parameter: str | None
  size_parameter: str | None

  def call(self, original: cst.Call, size: str | None) -> cst.Call:
    """The NNX call for the Linen `original`: the dropped arguments out, the
    size and `rngs` in."""
    args = []
    for i, arg in enumerate(original.args):
      name = arg.keyword.value if arg.keyword else (self.parameters[i] if i < len(self.parameters) else None)
      if name not in self.dropped:
        args.append(arg)
    if self.size_parameter is not None:
      args.append(syntax.keyword(self.size_parameter, syntax.expression(size)))
    args.append(syntax.keyword('rngs', cst.Name('rngs')))
    return cst.Call(original.func, syntax.normalised(args))

  def argument(self, original: cst.Call, parameter: str) -> cst.BaseExpression | None:
    """The expression `original` passes for `parameter`."""
    for i, arg in enumerate(original.args):
      if arg.star:
        return None
      name = arg.keyword.value if arg.keyword else (self.parameters[i] if i < len(self.parameters) else None)
      if name == parameter:
        return arg.value
    return None


def layer_class(file: source.SourceFile, func: cst.BaseExpression):
  """The object `func` names in the file's module, or None."""
  names = references.dotted(func)
  value = file.python_module
  for name in names or ['']:
    value = getattr(value, name, None)
  return value


def function_at(file: source.SourceFile, line: int) -> cst.FunctionDef | None:
  """The top-level function of the file whose body holds `line`."""
  for statement in file.module.body:
    if isinstance(statement, cst.FunctionDef):
      where = file.positions[statement]
      if where.start.line <= line <= where.end.line:
        return statement
  return None


def port_helper(file: source.SourceFile, function: cst.FunctionDef, cls: type) -> HelperPort:
  """`function` written for NNX (see the module docstring); `cls` is the
  class whose port calls it (named in a refusal). Raises `Untranslatable`."""

  def fail(node, message):
    raise Untranslatable(cls, file.line_of(node), f'{function.name.value}(...): {message}; port it by hand')

  params = function.params
  if params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or params.star_kwarg is not None or params.posonly_params:
    fail(function, 'a function with *args, **kwargs or positional-only parameters')
  parameters = [p.name.value for p in params.params]
  creations: list[cst.Call] = []
  function.body.visit(syntax.CallsWhere(
      lambda n: isinstance(n, cst.Call) and isinstance(layer_class(file, n.func), type)
      and issubclass(layer_class(file, n.func), references.nn.Module), creations,
  ))
  if not creations:
    fail(function, 'makes no Flax layer the port knows')
  specs = {}
  names_used = set()
  for call in creations:
    spec = layers.layer_spec(layer_class(file, call.func))
    if spec is None:
      fail(call, f'makes a {file.code(call.func)}, which the port writes only where a class creates it')
    if spec.mode or spec.module_fields:
      fail(call, f'makes a {spec.nnx.removeprefix("nnx.")} that takes a mode or a module')
    specs[call] = spec
    for arg in call.args:
      if arg.star:
        fail(call, 'a layer made with *args or **kwargs')
      if arg.keyword is not None and arg.keyword.value == 'name' and isinstance(arg.value, cst.Name):
        names_used.add(arg.value.value)
  if len(names_used) > 1:
    fail(function, f'its layers are named by several parameters ({sorted(names_used)})')
  name_parameter = next(iter(names_used), None)
  if name_parameter is not None and name_parameter not in parameters + [p.name.value for p in params.kwonly_params]:
    name_parameter = None
  sizes = {spec.in_features for spec in specs.values() if spec.in_features}
  size_parameter = None
  if sizes:
    size_parameter = sizes.pop() if len(sizes) == 1 else 'in_features'
    while size_parameter in parameters or size_parameter in source.names_in(function.body):
      size_parameter += '_'

  def nnx_creation(call: cst.Call, spec: layers.LayerSpec) -> cst.Call:
    fields = [f.name for f in dataclasses.fields(spec.linen) if f.init]
    expected = [p for p in spec.nnx_positional() if p != spec.in_features]
    nnx_params = spec.nnx_parameters()
    args = [cst.Arg(cst.Name(size_parameter))] if spec.in_features_first() else []
    positional = True
    for i, arg in enumerate(call.args):
      field = arg.keyword.value if arg.keyword else fields[i]
      if field == 'name':
        continue
      name = spec.nnx_argument(field)
      if name not in nnx_params:
        fail(call, f'{spec.nnx} has no argument {name!r} for Linen\'s {field!r}')
      keep = positional and arg.keyword is None and i < len(expected) and expected[i] == name
      positional = keep
      args.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT) if keep
                  else syntax.keyword(name, arg.value))
    if spec.in_features is not None and not spec.in_features_first():
      args.append(syntax.keyword(spec.in_features, cst.Name(size_parameter)))
    for field in spec.linen_defaults:
      if field not in {a.keyword.value if a.keyword else fields[i] for i, a in enumerate(call.args)}:
        args.append(syntax.keyword(spec.nnx_argument(field), syntax.expression(repr(spec.linen_default(field)))))
    if spec.rngs:
      args.append(syntax.keyword('rngs', cst.Name('rngs')))
    return cst.Call(syntax.expression(spec.written), syntax.normalised(args))

  class Rewrite(cst.CSTTransformer):
    def leave_Call(self, original, updated):
      if original in specs:
        return nnx_creation(updated, specs[original])
      return updated

    def leave_Annotation(self, original, updated):
      if references.is_linen(updated.annotation, file, 'Module'):
        return updated.with_changes(annotation=syntax.expression('nnx.Module'))
      return updated

  body = function.body.visit(Rewrite())
  dropped = {name_parameter} if name_parameter is not None and name_parameter not in source.names_in(body) else set()
  # Linen names left that NNX spells as the same objects; anything else refused.
  body = body.visit(references.LinenReferences(file, cls, strict=True, bound=syntax.bound_in(function)))
  kept = [p for p in params.params if p.name.value not in dropped]
  kwonly = [p for p in params.kwonly_params if p.name.value not in dropped]
  if size_parameter is not None:
    kwonly.append(cst.Param(cst.Name(size_parameter), annotation=cst.Annotation(cst.Name('int'))))
  kwonly.append(cst.Param(cst.Name('rngs'), annotation=cst.Annotation(syntax.expression('nnx.Rngs'))))
  returns = function.returns
  if returns is not None and references.is_linen(returns.annotation, file, 'Module'):
    returns = returns.with_changes(annotation=syntax.expression('nnx.Module'))
  node = function.with_changes(
      params=params.with_changes(
          params=syntax.params_normalised(kept), star_arg=cst.ParamStar(),
          kwonly_params=syntax.params_normalised(kwonly),
      ),
      body=body, returns=returns,
  )
  return HelperPort(node, parameters, dropped, name_parameter, size_parameter)
