"""One Linen class written with `@nn.compact`, rewritten as an NNX class.

Linen creates submodules where it calls them; NNX creates them in `__init__`
and calls them in `__call__`. From the compact method this writes both:

- `__init__` takes the Linen fields (same names, annotations and defaults),
  keeps them as attributes, and replays the part of the compact method that
  decides which modules exist: the loops and conditions around the creating
  expressions and the locals they read. Each creation becomes an NNX one,
  with the input size Linen inferred written as an expression of the fields
  and the inputs' shapes (`converters.port.shapes`), never as the traced
  number unless the source has it as a constant. Inputs whose sizes are
  needed become keyword arguments: `in_features` (the last axis of the only
  one needed) or `<argument>_shape`.
- `__call__` is the compact method with each creating expression replaced by
  the attribute holding the module: `self.dense_0`, or for modules created
  in a loop the loop over their `nnx.List` (`for conv in self.convs`).
- Flags the layers take from the call (`deterministic=not train`) become the
  NNX module's mode (`model.train()` / `model.eval()`): the argument leaves
  the signature when that is all it does.

What it cannot write it raises as `Untranslatable`, which the caller turns
into a marked stub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import libcst as cst
from flax import linen as nn

from converters.port import layers, shapes, source, tracing


#: Linen `Module` methods and properties NNX modules do not have (or have
#: with another meaning): code calling them is not yet ported.
LINEN_MODULE_API = frozenset(
    n for n in dir(nn.Module) if not n.startswith('_') and n not in ('setup',)
)


class Untranslatable(Exception):
  """A construct the port cannot write: `line` of the Linen source, why,
  and what to write by hand."""

  def __init__(self, cls: type, line: int | None, message: str):
    self.cls, self.line = cls, line
    super().__init__(message)


@dataclasses.dataclass
class InputParameter:
  """A constructor argument made of input sizes: `in_features` (one size) or
  `<argument>_shape` (the shape of the argument at `index`)."""

  name: str
  index: int
  ndim: int
  whole_shape: bool


@dataclasses.dataclass
class ClassPort:
  """What was written for one Linen class.

  Attributes:
    cls: the Linen class.
    node: the NNX class statement.
    attributes: creation site -> `(attribute, is_list)`: where the modules
      created there live in the NNX class.
    inputs: the constructor arguments made of input sizes.
    modes: `__call__` arguments that became the module's mode -> their value
      in training.
    fields: the Linen fields, which the constructor takes first.
  """

  cls: type
  node: cst.ClassDef
  attributes: dict[tracing.Site, tuple[str, bool]]
  inputs: list[InputParameter]
  modes: dict[str, bool]
  fields: list[str]
  call_parameters: list[str] = dataclasses.field(default_factory=list)

  def nnx_path(self, instance: tracing.Created, child: tracing.Created) -> tuple:
    """Where `child` (created by `instance` of this class) is in the port."""
    attribute, is_list = self.attributes[child.site]
    if not is_list:
      return (attribute,)
    siblings = [c for c in instance.children if c.site == child.site]
    return (attribute, siblings.index(child))


def _expression(code: str) -> cst.BaseExpression:
  return cst.parse_expression(code)


def _statement(code: str) -> cst.BaseStatement:
  return cst.parse_statement(code)


def _is_linen(node: cst.BaseExpression, file: source.SourceFile, attribute: str) -> bool:
  return (
      isinstance(node, cst.Attribute)
      and isinstance(node.value, cst.Name)
      and node.value.value in file.linen_names
      and node.attr.value == attribute
  )


def _compact_method(cdef: cst.ClassDef, file: source.SourceFile, cls: type) -> cst.FunctionDef:
  methods = [s for s in cdef.body.body if isinstance(s, cst.FunctionDef)]
  if any(m.name.value == 'setup' for m in methods):
    raise Untranslatable(cls, file.line_of(cdef), 'a module with setup(): not yet ported; port it by hand')
  compact = [
      m for m in methods
      if any(_is_linen(d.decorator, file, 'compact') for d in m.decorators)
  ]
  if len(compact) != 1 or compact[0].name.value != '__call__':
    raise Untranslatable(
        cls, file.line_of(cdef),
        'only a module whose @nn.compact method is __call__ is ported yet; port it by hand',
    )
  return compact[0]


def _fields(cdef: cst.ClassDef, cls: type, file: source.SourceFile, names: Sequence[str]) -> list[cst.AnnAssign]:
  """The class body's field declarations, in the dataclass's order."""
  declared = {
      s.body[0].target.value: s.body[0]
      for s in cdef.body.body
      if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
      and isinstance(s.body[0], cst.AnnAssign) and isinstance(s.body[0].target, cst.Name)
  }
  missing = [n for n in names if n not in declared]
  if missing:
    raise Untranslatable(
        cls, file.line_of(cdef),
        f'fields {missing} are inherited, not declared in the class; port the base class by hand',
    )
  return [declared[n] for n in names]


def _assigned_once(body: cst.CSTNode) -> dict[str, cst.BaseExpression | None]:
  """Local name -> its value, for names a simple `name = value` binds once
  (None for names bound more than once or otherwise)."""
  seen: dict[str, cst.BaseExpression | None] = {}

  class Visitor(cst.CSTVisitor):
    def visit_Assign(self, n: cst.Assign):
      for target in n.targets:
        for name in _target_names(target.target):
          simple = isinstance(target.target, cst.Name) and len(n.targets) == 1
          seen[name] = n.value if simple and name not in seen else None

    def visit_For(self, n: cst.For):
      for name in _target_names(n.target):
        seen[name] = None

    def visit_AugAssign(self, n: cst.AugAssign):
      for name in _target_names(n.target):
        seen[name] = None

  body.visit(Visitor())
  return seen


def _target_names(target: cst.BaseExpression) -> list[str]:
  if isinstance(target, cst.Name):
    return [target.value]
  if isinstance(target, (cst.Tuple, cst.List)):
    return [n for e in target.elements for n in _target_names(e.value)]
  return []


def _call_time_names(method: cst.FunctionDef, params: Sequence[str]) -> set[str]:
  """The arguments and every local computed from them (flow-insensitive)."""
  names = set(params)
  assignments: list[tuple[list[str], cst.CSTNode]] = []

  class Visitor(cst.CSTVisitor):
    def visit_Assign(self, n: cst.Assign):
      assignments.append(([x for t in n.targets for x in _target_names(t.target)], n.value))

    def visit_AugAssign(self, n: cst.AugAssign):
      assignments.append((_target_names(n.target), n))

    def visit_For(self, n: cst.For):
      assignments.append((_target_names(n.target), n.iter))

    def visit_AnnAssign(self, n: cst.AnnAssign):
      if n.value is not None:
        assignments.append((_target_names(n.target), n.value))

  method.body.visit(Visitor())
  changed = True
  while changed:
    changed = False
    for targets, value in assignments:
      if not set(targets) <= names and source.names_in(value) & names:
        names |= set(targets)
        changed = True
  return names


class _Writer:
  """Writes one class; see the module docstring."""

  def __init__(self, cls, instance, symbolic, child_ports):
    self.cls = cls
    self.instance = instance
    self.symbolic = symbolic
    self.child_ports = child_ports
    self.file = source.file_of(cls)
    self.cdef = self.file.class_def(cls)
    self.method = _compact_method(self.cdef, self.file, cls)
    self.field_names = shapes.module_fields(instance.module)
    self.params = [p.name.value for p in self.method.params.params[1:]]
    self.call_time = _call_time_names(self.method, self.params)
    self.locals = _assigned_once(self.method.body)
    self._refuse_linen_api()
    self.sites = self._sites()
    # Linen's names left once the creations are NNX's: checked on the source,
    # where each has its line.
    self.method.body.visit(LinenReferences(
        self.file, cls, strict=True, skip=[node.func for node, _ in self.sites.values()]
    ))
    self.attributes = self._attributes()
    self.used_dims: set[shapes.InputDim] = set()

  def _refuse_linen_api(self) -> None:
    """`self.param(...)`, `self.variable(...)`, `self.sow(...)`, ...: Linen's
    own methods, which the port does not write yet."""
    own = {s.name.value for s in self.cdef.body.body if isinstance(s, cst.FunctionDef)}
    own |= set(self.field_names)
    writer = self

    class Visitor(cst.CSTVisitor):
      def visit_Attribute(self, node):
        if (isinstance(node.value, cst.Name) and node.value.value == 'self'
            and node.attr.value in LINEN_MODULE_API and node.attr.value not in own):
          writer.fail(
              node,
              f'self.{node.attr.value}(...) is Linen\'s own Module API, which the port does not '
              'write yet; port it by hand',
          )

    self.cdef.visit(Visitor())

  def fail(self, node: cst.CSTNode | None, message: str):
    line = self.file.line_of(node) if node is not None else self.file.line_of(self.cdef)
    raise Untranslatable(self.cls, line, message)

  # --- what is created where

  def _sites(self) -> dict[tracing.Site, tuple[cst.Call, list[tracing.Created]]]:
    sites: dict[tracing.Site, tuple[cst.Call, list[tracing.Created]]] = {}
    method_range = self.file.positions[self.method]
    for child in self.instance.children:
      node = self.file.call_at(child.site) if child.site else None
      inside = node is not None and (
          method_range.start.line <= child.site.line <= method_range.end.line
      )
      if not inside:
        self.fail(
            self.method,
            f'{child.cls.__name__} {child.name!r} is not created by an expression of '
            f'{self.cls.__name__}.__call__ (created at {child.site}); port it by hand',
        )
      sites.setdefault(child.site, (node, []))[1].append(child)
    return sites

  def _loops(self, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The loops around `node` inside the method, innermost first."""
    out = []
    for parent in self.file.ancestors(node):
      if parent is self.method:
        break
      if isinstance(parent, (cst.For, cst.While)):
        out.append(parent)
      if isinstance(parent, (cst.FunctionDef, cst.Lambda, cst.ListComp, cst.GeneratorExp)):
        self.fail(node, 'a module created in a nested function or comprehension; port it by hand')
    return out

  def _attributes(self) -> dict[tracing.Site, tuple[str, bool]]:
    taken = set(self.field_names) | {'rngs'}
    attributes = {}
    for site, (node, children) in self.sites.items():
      explicit = self._argument(node, 'name')
      is_list = bool(self._loops(node)) or len(children) > 1
      if explicit is not None:
        if not isinstance(explicit, cst.SimpleString) or is_list:
          self.fail(node, 'a module named by an expression, or named in a loop; port it by hand')
        attribute = explicit.evaluated_value
      elif is_list:
        attribute = source.snake_case(children[0].cls.__name__) + 's'
      else:
        attribute = source.snake_case(children[0].name)
      while attribute in taken:
        attribute += '_'
      taken.add(attribute)
      attributes[site] = (attribute, is_list)
    return attributes

  @staticmethod
  def _argument(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    for arg in call.args:
      if arg.keyword is not None and arg.keyword.value == keyword:
        return arg.value
    return None

  # --- sizes

  def _size_source(self, value) -> str:
    table = self.symbolic.table
    for name in table.symbols_in(value):
      origin = table.origins[name]
      if isinstance(origin, shapes.InputDim):
        self.used_dims.add(origin)
    return table.source(value, self._origin_placeholder)

  @staticmethod
  def _origin_placeholder(origin) -> str:
    if isinstance(origin, shapes.FieldValue):
      text = origin.access[0]  # `__init__`'s argument of that name
      for k, a in enumerate(origin.access[1:]):
        last = k == len(origin.access) - 2 and origin.last
        text += ('[-1]' if last else f'[{a}]') if isinstance(a, int) else f'.{a}'
      return text
    return f'__input_{origin.index}_{origin.dim}'

  def _symbolic_child(self, child: tracing.Created) -> tracing.Created:
    for candidate in self.symbolic.root.children:
      if candidate.name == child.name:
        return candidate
    self.fail(None, f'{child.name} is not created when the sizes are symbolic; port it by hand')

  # --- creations

  def _linen_arguments(self, node: cst.Call, cls: type) -> list[tuple[str, cst.Arg]]:
    """`(field, arg)` of a Linen creation's arguments, positional ones named."""
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    out = []
    for i, arg in enumerate(node.args):
      if arg.star:
        self.fail(node, f'*args or **kwargs in the creation of {cls.__name__}; port it by hand')
      out.append((arg.keyword.value if arg.keyword else fields[i], arg))
    return out

  def _mode_argument(self, value: cst.BaseExpression, eval_value: bool, node) -> None:
    """Checks that a mode field's value is a call flag (or its negation)
    and records the flag's value in training."""
    negated = isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Not)
    inner = value.expression if negated else value
    if isinstance(inner, cst.Name) and inner.value not in self.params:
      alias = self.locals.get(inner.value)
      if alias is not None:
        return self._mode_argument(
            cst.UnaryOperation(cst.Not(), alias) if negated else alias, eval_value, node
        )
    if not isinstance(inner, cst.Name) or inner.value not in self.params:
      self.fail(
          node,
          f'{self.file.code(value)} sets a layer\'s mode from something other than an '
          'argument of __call__; port it by hand (NNX sets it with model.train() / .eval())',
      )
    train_value = eval_value if negated else not eval_value
    if self.modes.setdefault(inner.value, train_value) != train_value:
      self.fail(node, f'{inner.value} sets modes both ways; port it by hand')

  def _creation(self, site: tracing.Site) -> cst.BaseExpression:
    """The NNX expression creating the modules of `site`."""
    node, children = self.sites[site]
    child = children[0]
    spec = layers.layer_spec(child.cls)
    arguments = self._linen_arguments(node, child.cls)
    if spec is not None:
      return self._layer_creation(site, node, spec, arguments)
    if child.cls in self.child_ports:
      return self._module_creation(site, node, arguments)
    if layers.is_flax_class(child.cls):
      self.fail(node, f'Flax\'s {child.cls.__name__} has no NNX counterpart the port knows; port it by hand')
    self.fail(node, f'{child.cls.__name__} could not be ported; see its own entry')

  def _in_size(self, site, node, axis_of) -> str:
    """The source of the input size of `site`'s modules (one expression for
    every execution, or a running variable over the loop)."""
    node, children = self.sites[site]
    values = []
    for child in children:
      symbolic = self._symbolic_child(child)
      inputs = symbolic.calls[0].args
      if not inputs or not hasattr(inputs[0], 'shape'):
        self.fail(node, f'{child.name} is called without an array input; port it by hand')
      values.append(inputs[0].shape[axis_of(child)])
    texts = {self._size_source(v) for v in values}
    if len(texts) == 1:
      return texts.pop()
    return self._running_size(site, node, children, values)

  def _running_size(self, site, node, children, values) -> str:
    """A loop whose layers each take the previous one's output size: a
    running variable set before the loop and after each creation in it."""
    order = list(self.symbolic.root.children)
    loop = self._loops(node)[-1]
    for k, (child, value) in enumerate(zip(children, values)):
      if k == 0:
        continue
      symbolic = self._symbolic_child(child)
      before = order[order.index(symbolic) - 1]
      out = self._out_size(before)
      if out is None or str(out) != str(value):
        self.fail(
            node,
            f'the input size of {child.name} changes over the loop in a way the port cannot '
            'write; port it by hand',
        )
    self.running.setdefault(id(loop), (self._size_source(values[0]), []))
    return self.running_name

  def _out_size(self, symbolic_child: tracing.Created):
    spec = layers.layer_spec(type(symbolic_child.module))
    if spec is not None and spec.out_features is not None:
      return getattr(symbolic_child.module, spec.out_features)
    outputs = symbolic_child.calls[0].outputs
    return outputs.shape[-1] if hasattr(outputs, 'shape') else None

  def _layer_creation(self, site, node, spec: layers.LayerSpec, arguments) -> cst.BaseExpression:
    nnx_params = spec.nnx_parameters()
    args: list[cst.Arg] = []
    if spec.in_features is not None:
      axis = spec.feature_axis
      in_size = self._in_size(site, node, lambda child: axis)
      args.append(cst.Arg(_expression(in_size)))
    positional = True
    expected = [p for p in nnx_params if p != spec.in_features]
    for i, (field, arg) in enumerate(arguments):
      if field == 'name':
        continue
      if field in dict(spec.mode):
        self._mode_argument(arg.value, dict(spec.mode)[field], node)
        positional = False
        continue
      name = spec.nnx_argument(field)
      if name not in nnx_params:
        self.fail(node, f'{spec.nnx} has no argument {name!r} for Linen\'s {field!r}; port it by hand')
      if self.call_time & source.names_in(arg.value):
        # A size read from the inputs (`x.shape[-1]`) is one NNX knows when it
        # builds: the inputs' sizes are arguments of the constructor.
        arg = arg.with_changes(value=_expression(self._input_size_argument(site, node, field, arg)))
      keep_position = positional and arg.keyword is None and i < len(expected) and expected[i] == name
      if not keep_position:
        positional = False
      args.append(
          arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
          if keep_position else _keyword(name, arg.value)
      )
    if spec.rngs:
      args.append(_keyword('rngs', cst.Name('rngs')))
    return cst.Call(_expression(spec.nnx), _normalised(args))

  def _input_size_argument(self, site, node, field: str, arg: cst.Arg) -> str:
    """The source of a layer's size argument computed from the call's inputs."""
    texts = set()
    for child in self.sites[site][1]:
      value = getattr(self._symbolic_child(child).module, field)
      if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, 'dimension_as_value') or type(value).__name__ == '_DimExpr'):
        self.fail(
            node,
            f'{field}={self.file.code(arg.value)} depends on the inputs of the call; NNX '
            'builds its layers before any call: port it by hand',
        )
      texts.add(self._size_source(value))
    if len(texts) != 1:
      self.fail(node, f'{field}={self.file.code(arg.value)} changes over the loop; port it by hand')
    return texts.pop()

  def _module_creation(self, site, node, arguments) -> cst.BaseExpression:
    _, children = self.sites[site]
    port = self.child_ports[children[0].cls]
    args = [arg for field, arg in arguments if field != 'name']
    for field, arg in arguments:
      if field != 'name' and self.call_time & source.names_in(arg.value):
        self.fail(
            node,
            f'{field}={self.file.code(arg.value)} depends on the inputs of the call; port it by hand',
        )
    for parameter in port.inputs:
      texts = set()
      for child in children:
        symbolic = self._symbolic_child(child)
        shape = symbolic.calls[0].args[parameter.index].shape
        if parameter.whole_shape:
          texts.add('(' + ', '.join(self._size_source(d) for d in shape) + ',)')
        else:
          texts.add(self._size_source(shape[-1]))
      if len(texts) != 1:
        self.fail(node, f'the input sizes of {port.cls.__name__} change over the loop; port it by hand')
      args.append(_keyword(parameter.name, _expression(texts.pop())))
    args.append(_keyword('rngs', cst.Name('rngs')))
    return cst.Call(node.func, _normalised(args))

  def write(self) -> ClassPort:
    self.modes: dict[str, bool] = {}
    self.running: dict[int, tuple[str, list]] = {}
    names_in_method = source.names_in(self.method)
    self.running_name = next(
        n for n in ('in_features', 'features_in', 'in_size') if n not in names_in_method
    )
    self.node_sites = {node: site for site, (node, _) in self.sites.items()}
    init_body = self._init_block(list(self.method.body.body))
    call = self._call_method()
    inputs = self._input_parameters()
    fields = _fields(self.cdef, self.cls, self.file, self.field_names)
    init = self._init_method(fields, inputs, init_body)
    placeholders = {}
    for parameter in inputs:
      for dim in range(parameter.ndim):
        placeholders[f'__input_{parameter.index}_{dim}'] = (
            f'{parameter.name}[{dim - parameter.ndim if dim == parameter.ndim - 1 else dim}]'
            if parameter.whole_shape else parameter.name
        )
    init = init.visit(_PlaceholderSource(placeholders)).visit(_SelfAssignments())
    body = []
    for statement in self.cdef.body.body:
      if statement is self.method:
        body += [init, call]
      elif isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.AnnAssign):
        continue  # a field: the constructor takes it
      else:
        body.append(statement)
    bases = [
        b.with_changes(value=_expression('nnx.Module')) if _is_linen(b.value, self.file, 'Module') else b
        for b in self.cdef.bases
    ]
    node = self.cdef.with_changes(bases=bases, body=self.cdef.body.with_changes(body=body))
    node = node.visit(LinenReferences(self.file, self.cls, strict=False))
    return ClassPort(
        self.cls, node, self.attributes, inputs, self.modes, self.field_names,
    )

  def _input_parameters(self) -> list[InputParameter]:
    by_index: dict[int, set[shapes.InputDim]] = {}
    for dim in self.used_dims:
      by_index.setdefault(dim.index, set()).add(dim)
    if len(by_index) == 1:
      ((index, dims),) = by_index.items()
      (dim, *rest) = dims
      if not rest and dim.dim == dim.ndim - 1:
        return [InputParameter('in_features', index, dim.ndim, False)]
    return [
        InputParameter(f'{next(iter(dims)).name}_shape', index, next(iter(dims)).ndim, True)
        for index, dims in sorted(by_index.items())
    ]

  def _init_method(self, fields, inputs, body) -> cst.FunctionDef:
    params = [cst.Param(cst.Name('self'))]
    for field in fields:
      params.append(cst.Param(
          field.target, annotation=field.annotation,
          default=field.value, equal=cst.AssignEqual() if field.value is not None else cst.MaybeSentinel.DEFAULT,
      ))
    kwonly = [
        cst.Param(
            cst.Name(p.name),
            annotation=cst.Annotation(_expression('tuple[int, ...]' if p.whole_shape else 'int')),
        )
        for p in inputs
    ] + [cst.Param(cst.Name('rngs'), annotation=cst.Annotation(_expression('nnx.Rngs')))]
    # In `__init__` a field is its argument: `self.features` reads `features`.
    fields_read = set(self.field_names)

    class Arguments(cst.CSTTransformer):
      def leave_Attribute(self, original, updated):
        if (isinstance(updated.value, cst.Name) and updated.value.value == 'self'
            and updated.attr.value in fields_read):
          return cst.Name(updated.attr.value)
        return updated

    body = [s.visit(Arguments()) for s in body]
    statements = [_statement(f'self.{n} = {n}\n') for n in self.field_names] + body
    return cst.FunctionDef(
        name=cst.Name('__init__'),
        params=cst.Parameters(params=params, star_arg=cst.ParamStar(), kwonly_params=kwonly),
        body=cst.IndentedBlock(statements),
        leading_lines=self.method.leading_lines,
    )

  def _init_block(self, statements) -> list[cst.BaseStatement]:
    """The statements of `__init__` for a block of the compact method."""
    emitted: list[tuple[cst.BaseStatement, bool]] = []  # (statement, is a candidate local)
    for statement in statements:
      finder = _Creations(self.node_sites)
      statement.visit(finder)
      if isinstance(statement, cst.For):
        inner = self._init_block(list(statement.body.body))
        if not inner:
          continue
        if self.call_time & source.names_in(statement.iter):
          self.fail(statement, 'a loop creating modules over values of the call; port it by hand')
        prelude = [
            _statement(f'self.{self.attributes[site][0]} = nnx.List()\n')
            for site, (node, _) in self.sites.items()
            if self.attributes[site][1] and self._loops(node)[-1] is statement
        ]
        if id(statement) in self.running:
          prelude.append(_statement(f'{self.running_name} = {self.running[id(statement)][0]}\n'))
        loop = statement.with_changes(body=statement.body.with_changes(body=inner), orelse=None)
        emitted += [(s, False) for s in prelude] + [(loop, False)]
      elif isinstance(statement, cst.If):
        inner = self._init_block(list(statement.body.body))
        orelse = statement.orelse
        if orelse is not None:
          block = orelse.body.body if isinstance(orelse, cst.Else) else [orelse]
          if self._init_block(list(block)):
            self.fail(statement, 'modules created in an elif/else branch; port it by hand')
        if not inner:
          continue
        if self.call_time & source.names_in(statement.test):
          self.fail(
              statement,
              f'modules created under a condition on the call ({self.file.code(statement.test)}); '
              'NNX decides which modules exist when it builds them: port it by hand',
          )
        emitted.append((statement.with_changes(body=statement.body.with_changes(body=inner), orelse=None), False))
      elif finder.found:
        if not isinstance(statement, cst.SimpleStatementLine):
          self.fail(statement, 'a module created in a statement the port does not handle; port it by hand')
        for node in finder.found:
          site = self.node_sites[node]
          attribute, is_list = self.attributes[site]
          creation = self._creation(site)
          target = f'self.{attribute}'
          line = (
              cst.Expr(cst.Call(_expression(f'{target}.append'), [cst.Arg(creation)]))
              if is_list else cst.Assign([cst.AssignTarget(_expression(target))], creation)
          )
          emitted.append((cst.SimpleStatementLine([line]), False))
          update = self._running_update(node, site)
          if update is not None:
            emitted.append((update, False))
      elif isinstance(statement, cst.SimpleStatementLine) and all(
          isinstance(s, cst.Assign) for s in statement.body
      ):
        targets = {n for s in statement.body for t in s.targets for n in _target_names(t.target)}
        if targets and not targets & self.call_time and not _is_field_alias(statement, self.field_names):
          emitted.append((statement, True))
    # Locals the kept statements read, and what those read in turn.
    needed = set()
    for statement, candidate in emitted:
      if not candidate:
        needed |= source.names_in(statement)
    kept = {id(s) for s, candidate in emitted if not candidate}
    changed = True
    while changed:
      changed = False
      for statement, candidate in emitted:
        if candidate and id(statement) not in kept:
          targets = {n for s in statement.body for t in s.targets for n in _target_names(t.target)}
          if targets & needed:
            kept.add(id(statement))
            needed |= source.names_in(statement)
            changed = True
    return [s for s, _ in emitted if id(s) in kept]

  def _running_update(self, node, site) -> cst.BaseStatement | None:
    loops = self._loops(node)
    if not loops or id(loops[-1]) not in self.running:
      return None
    child = self.sites[site][1][0]
    spec = layers.layer_spec(child.cls)
    if spec is None or spec.out_features is None:
      return None
    arguments = dict(self._linen_arguments(node, child.cls))
    if spec.out_features not in arguments:
      self.fail(node, f'{child.cls.__name__} without its {spec.out_features!r} argument; port it by hand')
    value = self.file.code(arguments[spec.out_features].value)
    return _statement(f'{self.running_name} = {value}\n')

  def _call_method(self) -> cst.FunctionDef:
    """`__call__`: the compact method with modules read from attributes."""
    replacements: dict[cst.CSTNode, cst.CSTNode] = {}
    lists_by_loop: dict[int, list] = {}
    for site, (node, _) in self.sites.items():
      attribute, is_list = self.attributes[site]
      if not is_list:
        replacements[node] = _expression(f'self.{attribute}')
        continue
      lists_by_loop.setdefault(id(self._loops(node)[0]), []).append((site, node))
    used = source.names_in(self.method)
    loop_rewrites: dict[int, tuple] = {}
    prelude: dict[int, list[str]] = {}
    for site, (node, _) in self.sites.items():
      attribute, is_list = self.attributes[site]
      if not is_list:
        continue
      loops = self._loops(node)
      conditional = any(
          isinstance(a, cst.If) for a in _between(self.file, node, loops[0])
      )
      simple = (
          len(loops) == 1 and isinstance(loops[0], cst.For)
          and len(lists_by_loop[id(loops[0])]) == 1 and not conditional
      )
      name = attribute[:-1] if attribute.endswith('s') else attribute + '_'
      while name in used:
        name += '_'
      used.add(name)
      if simple:
        replacements[node] = cst.Name(name)
        loop_rewrites[id(loops[0])] = (name, attribute)
      else:
        iterator = f'{attribute}_iter'
        while iterator in used:
          iterator += '_'
        used.add(iterator)
        replacements[node] = _expression(f'next({iterator})')
        prelude.setdefault(id(loops[-1]), []).append(f'{iterator} = iter(self.{attribute})\n')
    writer = self

    class Rewrite(cst.CSTTransformer):
      def leave_Call(self, original, updated):
        if original in replacements:
          return replacements[original]
        if original.func in writer.node_sites:
          return writer._without_mode_arguments(original, updated)
        return updated

      def leave_For(self, original, updated):
        if id(original) in loop_rewrites:
          name, attribute = loop_rewrites[id(original)]
          if source.names_in(updated.target) & source.names_in(updated.body):
            updated = updated.with_changes(
                target=_expression(f'({writer.file.code(original.target)}, {name})').with_changes(
                    lpar=[], rpar=[]),
                iter=cst.Call(cst.Name('zip'), [
                    cst.Arg(updated.iter, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))),
                    cst.Arg(_expression(f'self.{attribute}')),
                ]),
            )
          else:
            updated = updated.with_changes(target=cst.Name(name), iter=_expression(f'self.{attribute}'))
        if id(original) in prelude:
          return cst.FlattenSentinel([_statement(s) for s in prelude[id(original)]] + [updated])
        return updated

      def leave_Decorator(self, original, updated):
        if _is_linen(original.decorator, writer.file, 'compact'):
          return cst.RemoveFromParent()
        return updated

    method = self.method.visit(Rewrite())
    # Mode flags leave the signature, with the locals that only served them.
    for flag in self.modes:
      method = self._drop_flag(method, flag)
    return _without_unused_locals(method)

  def _without_mode_arguments(self, original: cst.Call, updated: cst.Call) -> cst.Call:
    """A call of a created user module without the arguments its port took
    as its mode."""
    site = self.node_sites[original.func]
    child = self.sites[site][1][0]
    port = self.child_ports.get(child.cls)
    if port is None or not port.modes:
      return updated
    parameters = port.call_parameters
    kept = []
    for i, arg in enumerate(updated.args):
      name = arg.keyword.value if arg.keyword else (parameters[i] if i < len(parameters) else None)
      if name in port.modes:
        value = original.args[i].value
        flag = value.value if isinstance(value, cst.Name) else None
        if flag not in self.params:
          self.fail(original, f'{name}={self.file.code(value)}: the port passes modes along from an argument only; port it by hand')
        if self.modes.setdefault(flag, port.modes[name]) != port.modes[name]:
          self.fail(original, f'{flag} sets modes both ways; port it by hand')
        continue
      kept.append(arg)
    return updated.with_changes(args=_normalised(kept))

  def _drop_flag(self, method: cst.FunctionDef, flag: str) -> cst.FunctionDef:
    aliases = {name for name, value in self.locals.items() if value is not None and flag in source.names_in(value)}

    class Drop(cst.CSTTransformer):
      def leave_SimpleStatementLine(self, original, updated):
        if all(isinstance(s, cst.Assign) for s in updated.body):
          targets = {n for s in updated.body for t in s.targets for n in _target_names(t.target)}
          if targets and targets <= aliases:
            return cst.RemoveFromParent()
        return updated

    method = method.visit(Drop())
    params = _params_normalised([p for p in method.params.params if p.name.value != flag])
    kwonly = _params_normalised([p for p in method.params.kwonly_params if p.name.value != flag])
    method = method.with_changes(params=method.params.with_changes(params=params, kwonly_params=kwonly))
    if flag in source.names_in(method.body) or aliases & source.names_in(method.body):
      self.fail(
          self.method,
          f'{flag!r} does more than set the layers\' modes (NNX sets them with model.train() / '
          '.eval()); port it by hand',
      )
    return method



def _params_normalised(params: list[cst.Param]) -> list[cst.Param]:
  """Parameters without a comma after the last."""
  return params[:-1] + [params[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)] if params else params


def _is_field_alias(statement, fields) -> bool:
  """`config = self.config` for a field `config`: in `__init__` the argument
  of that name already is it."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
    return False
  small = statement.body[0]
  return (
      isinstance(small, cst.Assign) and len(small.targets) == 1
      and isinstance(small.targets[0].target, cst.Name)
      and small.targets[0].target.value in fields
      and isinstance(small.value, cst.Attribute)
      and isinstance(small.value.value, cst.Name) and small.value.value.value == 'self'
      and small.value.attr.value == small.targets[0].target.value
  )


class _SimpleAssignments(cst.CSTVisitor):
  """`name = value` statements whose value calls nothing (no side effect)."""

  def __init__(self):
    self.found: list[cst.SimpleStatementLine] = []

  def visit_SimpleStatementLine(self, node):
    if len(node.body) == 1 and isinstance(node.body[0], cst.Assign):
      assign = node.body[0]
      calls: list[cst.Call] = []
      assign.value.visit(_CallFinder(calls))
      if not calls and all(isinstance(t.target, cst.Name) for t in assign.targets):
        self.found.append(node)


def _without_unused_locals(method: cst.FunctionDef) -> cst.FunctionDef:
  """`method` without the simple assignments (no call in the value) of
  locals nothing reads any more (what served only the moved creations)."""
  while True:
    finder = _SimpleAssignments()
    method.body.visit(finder)
    unused = {
        node for node in finder.found
        if not {t.target.value for t in node.body[0].targets} & _reads(method.body, exclude=node)
    }
    if not unused:
      return method
    method = method.visit(_Remove(unused))


class _CallFinder(cst.CSTVisitor):
  def __init__(self, found):
    self.found = found

  def visit_Call(self, node):
    self.found.append(node)


class _Remove(cst.CSTTransformer):
  def __init__(self, nodes):
    self.nodes = nodes

  def leave_SimpleStatementLine(self, original, updated):
    return cst.RemoveFromParent() if original in self.nodes else updated


def _reads(node: cst.CSTNode, exclude: cst.CSTNode) -> set[str]:
  """The names read anywhere in `node` but inside `exclude`'s targets."""
  found: set[str] = set()

  class Visitor(cst.CSTVisitor):
    def visit_SimpleStatementLine(self, n):
      if n is exclude:
        exclude.body[0].value.visit(self)
        return False
      return True

    def visit_AssignTarget(self, n):
      if not isinstance(n.target, cst.Name):
        n.target.visit(self)
      return False

    def visit_Name(self, n):
      found.add(n.value)

    def visit_Attribute(self, n):
      n.value.visit(self)
      return False

    def visit_Arg(self, n):
      n.value.visit(self)
      return False

  node.visit(Visitor())
  return found


_NO_SPACE = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(''), whitespace_after=cst.SimpleWhitespace('')
)


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
  """`name=value`, spaced as PEP 8 spaces keyword arguments."""
  return cst.Arg(value, keyword=cst.Name(name), equal=_NO_SPACE)


def _normalised(args: list[cst.Arg]) -> list[cst.Arg]:
  """Arguments with `, ` between them and no comma after the last (a
  multi-line call keeps its own layout)."""
  out = []
  for i, arg in enumerate(args):
    if i + 1 < len(args):
      comma = arg.comma if isinstance(arg.comma, cst.Comma) else cst.Comma(
          whitespace_after=cst.SimpleWhitespace(' ')
      )
    else:
      comma = cst.MaybeSentinel.DEFAULT
    out.append(arg.with_changes(comma=comma))
  return out


class _Creations(cst.CSTVisitor):
  """The creating calls inside a node, in source order."""

  def __init__(self, nodes):
    self.nodes, self.found = nodes, []

  def visit_Call(self, node):
    if node in self.nodes:
      self.found.append(node)


class _SelfAssignments(cst.CSTTransformer):
  """Drops `x = x` (a running size that starts as the argument of its name)."""

  def leave_SimpleStatementLine(self, original, updated):
    if len(updated.body) == 1 and isinstance(updated.body[0], cst.Assign):
      assign = updated.body[0]
      if (len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
          and isinstance(assign.value, cst.Name)
          and assign.targets[0].target.value == assign.value.value):
        return cst.RemoveFromParent()
    return updated


class _PlaceholderSource(cst.CSTTransformer):
  def __init__(self, table):
    self.table = table

  def leave_Name(self, original, updated):
    if updated.value in self.table:
      return _expression(self.table[updated.value])
    return updated


def _dotted(node: cst.BaseExpression) -> list[str] | None:
  """`['nn', 'initializers', 'zeros']` of `nn.initializers.zeros`, or None."""
  if isinstance(node, cst.Name):
    return [node.value]
  if isinstance(node, cst.Attribute):
    head = _dotted(node.value)
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
    names = _dotted(node)
    if node in self.skip:
      return False
    if names is None or names[0] not in self.file.linen_names:
      return True
    from flax import linen as nn
    from flax import nnx
    linen_object = _resolve(nn, names[1:])
    if linen_object is not _MISSING and _resolve(nnx, names[1:]) is linen_object:
      self.replaced[node] = _expression('.'.join(['nnx'] + names[1:]))
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


def _between(file: source.SourceFile, node, ancestor):
  for parent in file.ancestors(node):
    if parent is ancestor:
      return
    yield parent


def port_class(
    cls: type,
    instance: tracing.Created,
    symbolic: shapes.SymbolicTrace,
    child_ports: dict[type, ClassPort],
) -> ClassPort:
  """The NNX class of the compact Linen class `cls`, written from `instance`
  (one traced instance) and its symbolic trace; `child_ports` are the ports
  of the user's classes it creates. Raises `Untranslatable`."""
  writer = _Writer(cls, instance, symbolic, child_ports)
  port = writer.write()
  port.call_parameters = writer.params
  return port
