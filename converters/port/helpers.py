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
  return _HelperWriter(file, function, cls).write()


class _HelperWriter:
  """`port_helper` of one function: the layers it makes, each checked and
  written as NNX makes it, and its parameters as the port calls it."""

  def __init__(self, file: source.SourceFile, function: cst.FunctionDef, cls: type):
    self.file, self.function, self.cls = file, function, cls
    self.specs: dict[cst.Call, layers.LayerSpec] = {}  # each layer made -> its layer's spec
    self.size_parameter: str | None = None

  def write(self) -> HelperPort:
    params = self.function.params
    if params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or params.star_kwarg is not None or params.posonly_params:
      self._fail(self.function, 'a function with *args, **kwargs or positional-only parameters')
    parameters = [p.name.value for p in params.params]
    self.specs = self._layers_made()
    name_parameter = self._name_parameter(parameters)
    self.size_parameter = self._size_parameter(parameters)
    body = self.function.body.visit(_NnxCreations(self))
    dropped = {name_parameter} if name_parameter is not None and name_parameter not in syntax.names_in(body) else set()
    # Linen names left that NNX spells as the same objects; anything else refused.
    body = body.visit(references.LinenReferences(self.file, self.cls, strict=True, bound=syntax.bound_in(self.function)))
    return HelperPort(self._written(body, dropped), parameters, dropped, name_parameter, self.size_parameter)

  def _fail(self, node: cst.CSTNode, message: str):
    raise Untranslatable(self.cls, self.file.line_of(node), f'{self.function.name.value}(...): {message}; port it by hand')

  def _layers_made(self) -> dict[cst.Call, layers.LayerSpec]:
    """The function's calls that make Flax layers, each with its layer's
    spec; refused unless the port writes every one of them."""
    file = self.file
    creations: list[cst.Call] = []
    self.function.body.visit(syntax.CallsWhere(
        lambda n: isinstance(n, cst.Call) and isinstance(layer_class(file, n.func), type)
        and issubclass(layer_class(file, n.func), references.nn.Module), creations,
    ))
    if not creations:
      self._fail(self.function, 'makes no Flax layer the port knows')
    specs = {}
    for call in creations:
      spec = layers.layer_spec(layer_class(file, call.func))
      if spec is None:
        self._fail(call, f'makes a {file.code(call.func)}, which the port writes only where a class creates it')
      if spec.mode or spec.module_fields:
        self._fail(call, f'makes a {spec.nnx.removeprefix("nnx.")} that takes a mode or a module')
      specs[call] = spec
      if any(arg.star for arg in call.args):
        self._fail(call, 'a layer made with *args or **kwargs')
    return specs

  def _name_parameter(self, parameters: list[str]) -> str | None:
    """The parameter the layers are named by (`name=name`), if one is."""
    names_used = {
        arg.value.value for call in self.specs for arg in call.args
        if arg.keyword is not None and arg.keyword.value == 'name' and isinstance(arg.value, cst.Name)
    }
    if len(names_used) > 1:
      self._fail(self.function, f'its layers are named by several parameters ({sorted(names_used)})')
    name_parameter = next(iter(names_used), None)
    if name_parameter is not None and name_parameter not in parameters + [
        p.name.value for p in self.function.params.kwonly_params]:
      return None
    return name_parameter

  def _size_parameter(self, parameters: list[str]) -> str | None:
    """The keyword-only parameter taking the input size, named as the
    layers' NNX argument for it (`in_features` if they differ), if a layer
    needs one."""
    sizes = {spec.in_features for spec in self.specs.values() if spec.in_features}
    if not sizes:
      return None
    size_parameter = sizes.pop() if len(sizes) == 1 else 'in_features'
    while size_parameter in parameters or size_parameter in syntax.names_in(self.function.body):
      size_parameter += '_'
    return size_parameter

  def nnx_creation(self, call: cst.Call, spec: layers.LayerSpec) -> cst.Call:
    """The NNX layer `call` (a Linen creation) makes: its arguments by NNX's
    names, the input size and `rngs` added, `name=` left out."""
    fields = [f.name for f in dataclasses.fields(spec.linen) if f.init]
    expected = [p for p in spec.nnx_positional() if p != spec.in_features]
    nnx_params = spec.nnx_parameters()
    args = [cst.Arg(cst.Name(self.size_parameter))] if spec.in_features_first() else []
    positional = True
    for i, arg in enumerate(call.args):
      field = arg.keyword.value if arg.keyword else fields[i]
      if field == 'name':
        continue
      name = spec.nnx_argument(field)
      if name not in nnx_params:
        self._fail(call, f'{spec.nnx} has no argument {name!r} for Linen\'s {field!r}')
      keep = positional and arg.keyword is None and i < len(expected) and expected[i] == name
      positional = keep
      args.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT) if keep
                  else syntax.keyword(name, arg.value))
    if spec.in_features is not None and not spec.in_features_first():
      args.append(syntax.keyword(spec.in_features, cst.Name(self.size_parameter)))
    for field in spec.linen_defaults:
      if field not in {a.keyword.value if a.keyword else fields[i] for i, a in enumerate(call.args)}:
        args.append(syntax.keyword(spec.nnx_argument(field), syntax.expression(repr(spec.linen_default(field)))))
    if spec.rngs:
      args.append(syntax.keyword('rngs', cst.Name('rngs')))
    return cst.Call(syntax.expression(spec.written), syntax.normalised(args))

  def _written(self, body: cst.BaseSuite, dropped: set[str]) -> cst.FunctionDef:
    """The function with `body`, without the parameters `dropped`, with the
    size and `rngs` keyword-only, and returning NNX's module where it
    returned Linen's."""
    function, params, file = self.function, self.function.params, self.file
    kept = [p for p in params.params if p.name.value not in dropped]
    kwonly = [p for p in params.kwonly_params if p.name.value not in dropped]
    if self.size_parameter is not None:
      kwonly.append(cst.Param(cst.Name(self.size_parameter), annotation=cst.Annotation(cst.Name('int'))))
    kwonly.append(cst.Param(cst.Name('rngs'), annotation=cst.Annotation(syntax.expression('nnx.Rngs'))))
    returns = function.returns
    if returns is not None and references.is_linen(returns.annotation, file, 'Module'):
      returns = returns.with_changes(annotation=syntax.expression('nnx.Module'))
    return function.with_changes(
        params=params.with_changes(
            params=syntax.params_normalised(kept), star_arg=cst.ParamStar(),
            kwonly_params=syntax.params_normalised(kwonly),
        ),
        body=body, returns=returns,
    )


class _NnxCreations(cst.CSTTransformer):
  """A helper's body with its layers made as NNX makes them, and `nn.Module`
  annotations as `nnx.Module`."""

  def __init__(self, writer: _HelperWriter):
    super().__init__()
    self.writer = writer

  def leave_Call(self, original, updated):
    if original in self.writer.specs:
      return self.writer.nnx_creation(updated, self.writer.specs[original])
    return updated

  def leave_Annotation(self, original, updated):
    if references.is_linen(updated.annotation, self.writer.file, 'Module'):
      return updated.with_changes(annotation=syntax.expression('nnx.Module'))
    return updated
