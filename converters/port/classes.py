"""What the port's class writers share: the NNX class written for a Linen
class (`ClassPort`) and the writer both styles build on (`ClassWriter`).

A writer finds the submodules the traced instance created and the
expressions that created them (`sites`), writes each creation as NNX's
(Flax layers from `converters.port.layers`, the user's modules as their
ports, the input sizes Linen inferred from the symbolic trace), turns the
arguments that only set a layer's mode into the NNX mode, writes the
module's own variables (`converters.port.variables`), and assembles the
class: `__init__` (the Linen fields, then the input sizes it needs, then
`rngs`) and the methods. `converters.port.compact` and
`converters.port.setup_style` say where the creations are and how the
methods change.
"""


from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import libcst as cst
from flax import linen as nn

from converters.port import (
  branches,
  caches,
  constructor,
  creation_arguments,
  creations,
  factories,
  handed,
  helpers,
  input_sizes,
  layers,
  mode_flags,
  partials,
  references,
  shapes,
  shared_scopes,
  source,
  syntax,
  tracing,
  transforms,
  variables,
)
from converters.port.errors import Untranslatable


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
    field_modes: fields that became the module's mode (`deterministic` of a
      block that only hands it to its dropouts) -> their value in training;
      the NNX constructor does not take them.
    helpers: the file's functions that make layers, as the port writes
      them (`converters.port.helpers`), by name.
    call_parameters: `__call__`'s parameters (positional, then keyword-only).
    writer: the writer, which says where each submodule went (`nnx_path`).
  """

  cls: type
  node: cst.ClassDef
  attributes: dict[tracing.Site, tuple[str, bool]]
  inputs: list[constructor.InputParameter]
  modes: dict[str, bool]
  call_parameters: list[str]
  writer: ClassWriter
  field_modes: dict[str, bool] = dataclasses.field(default_factory=dict)
  helpers: dict[str, cst.FunctionDef] = dataclasses.field(default_factory=dict)
  #: Whether the port has `init_cache` (its layers, or it, hold a decode cache).
  has_cache: bool = False
  #: Module statements written before the class (`default_init = ...`).
  constants: list[cst.SimpleStatementLine] = dataclasses.field(default_factory=list)

  def nnx_path(self, instance: tracing.Created, child: tracing.Created) -> tuple:
    """Where `child` (created by `instance`, any instance of this class) is
    in the port."""
    return self.writer.nnx_path(child)


class ClassWriter:
  """Writes one class: see the module docstring. Subclasses say where the
  creations are (`_methods`, `loops_around`, `_attributes`, `nnx_path`) and
  write the class (`write`)."""

  #: Whether the writer writes `self.has_variable('cache', ...)` (a cache
  #: NNX makes where it builds the module: always there).
  writes_has_cache = False
  #: Whether the writer writes `self.make_rng(stream)` (a draw from the
  #: `nnx.Rngs` the module keeps: `self.rngs.<stream>()`).
  writes_draws = False
  #: Whether the writer writes `__call__` decorated with Linen's scan over
  #: its inputs (`functools.partial(nn.scan, variable_broadcast='params',
  #: ...)`) as `nnx.scan` over the method.
  writes_method_scan = False
  #: Whether the writer keeps in `__init__` the partials the method hands on
  #: (`norm=norm` to a block), as NNX partials (`nnx_factory`).
  keeps_factories = False
  #: Whether the writer writes `nn.share_scope(self, local)` of a module the
  #: method makes (an attribute named by the local, its variables mapped
  #: from the class's own scope).
  writes_shared_scopes = False
  #: Whether the writer makes the parameters a function of the file makes
  #: through the module it is handed (`handed`).
  writes_handed_functions = False

  def __init__(self, cls, instances, symbolic_trace, child_ports, refused=None):
    self.cls = cls
    #: `[(instances, why)]`: instances of configurations the proof adds that
    #: the class is not written for, each group with what stopped it; the
    #: branches they take are written to raise, saying why
    #: (`branches.UntracedBranch.refused`).
    self.refused: Sequence[tuple[Sequence[tracing.Created], str]] = refused or ()
    # Every instance of the class the model made: together they create all
    # the class's submodules (a shortcut only some blocks have).
    self.instances = list(instances)
    self.instance = instance = self.instances[0]
    self._symbolic_trace = symbolic_trace
    self._symbolic: dict[frozenset, shapes.SymbolicTrace] = {}
    self.child_ports = child_ports
    self.file = source.file_of(cls)
    self.cdef = self.file.class_def(cls)
    # A setup() class with no `__call__`, called through its methods (Gemma's
    # `Embedder.encode` / `.decode`): written from the first one called.
    through_methods = 'setup' in vars(cls) and not any('__call__' in vars(c) for c in cls.__mro__) and bool(
        instance.calls)
    if not instance.calls or instance.calls[0].method != '__call__' and not through_methods:
      # Its first call seen is another method's (nn.RNN asks a cell for its
      # `initialize_carry`, then calls it inside its scan, unseen). (Flax's
      # own cells are read from their kernels; a class of the user's has no
      # such spec.)
      raise Untranslatable(cls, self.file.line_of(self.cdef), f'{cls.__name__} is called only inside a '
                           'transform (a cell under nn.RNN, say), where the trace does not see its inputs; '
                           'port it by hand')
    self.symbolic = self.symbolic_of(instance)
    self.sizes = input_sizes.InputSizes(self)
    # `method` creates the submodules, `call` is `__call__`: the compact
    # method both, or `setup` and `__call__`.
    self.method, self.call = self._methods()
    #: Whether `__call__` is Linen's scan over its inputs (`nnx.scan` in NNX).
    self.scans_call = any(transforms.is_method_scan(d, self.file) for d in self.call.decorators)
    lifted = {m for i in self.instances for m in i.lifted_methods}
    for statement in self.cdef.body.body:
      if isinstance(statement, cst.FunctionDef) and statement is not self.call and any(
          transforms.is_method_scan(d, self.file) or references.linen_transform(d.decorator, self.file)
          for d in statement.decorators):
        lifted.add(statement.name.value)  # (called or not: the port writes no other)
    if lifted - {'__call__'} or (lifted and not (self.scans_call and self.writes_method_scan)):
      self.fail(self.call if '__call__' in lifted else self.cdef,
                f'{", ".join(sorted(lifted))} decorated with a lifted transform the port does not write '
                '(it writes nn.scan over the inputs of a compact __call__); port it by hand')
    self.field_names = shapes.module_fields(instance.module)
    self.params = [p.name.value for p in self.call.params.params[1:]] + [
        p.name.value for p in self.call.params.kwonly_params
    ]
    self.call_time = self._call_time()
    self.locals = syntax.assigned_once(self.call.body)
    self.mode_flags = mode_flags.ModeFlags(self)
    for name in sorted(self.mode_flags.merged):
      if any(getattr(i.module, name) is False for i in self.instances):
        # The checks run the port in eval mode (which sets the attribute),
        # as NNX's layers are run: training is asked for at the call.
        self.fail(self.cdef, f'{self.cls.__name__} is configured {name}=False, a field NNX\'s model.eval() / '
                  f'.train() set: configure it None and give {name}=False to the call (the factory\'s '
                  'keyword), as a training step does; or port it by hand')
    #: Module statements the class reads (its fields' computed defaults).
    self.constants: list[cst.SimpleStatementLine] = []
    self.draws: set[str] = set()  # the streams `self.make_rng` draws from
    #: Linen collections other than `intermediates` the class sows into ->
    #: the `nnx.Intermediate` subclass the file defines for each.
    self.sown: dict[str, str] = {}
    self._refuse_linen_api()
    for name in self.field_names:
      for held in self.instances:
        # A module the model makes and hands on (one embedding shared by an
        # encoder and a decoder) is handed on in NNX too; one made outside
        # the model is Linen's, which NNX cannot call.
        value = getattr(held.module, name)
        if isinstance(value, nn.Module) and (value.scope is None or not value.path):
          self.fail(self.cdef, f'the field {name!r} holds a Linen module made outside the model; NNX modules '
                    'are built in __init__, from arguments: port it by hand')
    for decorator in self.cdef.decorators:
      if self.file.linen_path(decorator.decorator) is not None:
        self.fail(decorator, f'the class is decorated with {self.file.code(decorator.decorator)}; '
                  'port it by hand')
    # The locals the creating method binds once (`norm = partial(...)`).
    self.method_locals = self.locals if self.method is self.call else syntax.assigned_once(self.method.body)
    self.arguments = creation_arguments.CreationArguments(self)
    #: Linen variable name -> the NNX attribute holding it, where they differ
    #: (`self.table = self.param('embedding', ...)` in `setup()`).
    self.variable_attributes: dict[str, str] = {}
    self.sites = self._sites()
    self.handed_calls = self._handed_calls()
    self.callees = factories.Callees(self.file, instance.module, tuple(self.field_names), self.method_locals)
    found = factories.read(self.sites, self.callees, self.keeps_factories, self.fail)
    self.factories, self.lifts, self.lift_calls = found.partials, found.lifts, found.lift_calls
    self.partials = partials.Partials(self)
    # Flax layer classes (or partials of them) handed to the user's blocks.
    self.handed = factories.handed_classes(self.sites, self.file)
    #: Blocks of an `if` on the configuration creating only what no trace
    #: made: `__init__` and `__call__` raise there (`untraced_raise`).
    self.untraced_branches = branches.untraced_branches(self)
    #: Creation site -> the `nn.share_scope(self, local)` of the modules made
    #: there (`shared_scopes`).
    self.shared_scopes = shared_scopes.read(
        self.method, self.file, self.sites, self._exclusive, self.fail) if self.writes_shared_scopes else {}
    # Linen's names left once the creations are NNX's: checked on the source,
    # where each has its line.
    self.method.body.visit(references.LinenReferences(
        self.file, cls, strict=True,
        skip=[node.func for node, _ in self.sites.values()]
        + [partial.args[0].value for partial in self.factories.values()] + self.lift_calls
        + list(self.handed) + list(self.untraced_branches)
        + [shared.statement for shared in self.shared_scopes.values()],
        bound=syntax.bound_in(self.method),
    ))
    self.attributes = self._attributes()
    #: Keywords of the constructor for dtypes Linen reads off the call
    #: (`inputs.dtype`): name -> its default, the traced dtype's name.
    self.dtype_parameters: dict[str, str] = {}
    # Sites of modules created as another creation's argument (an RNN's
    # cell): site -> (the creation's site, the NNX attribute holding it).
    self.inlined: dict = {}
    self.creations = creations.Creations(self)

  def _refuse_linen_api(self) -> None:
    """`self.param(...)`, `self.variable(...)`, `self.sow(...)`, ...: Linen's
    own methods, which the port does not write yet."""
    own = {s.name.value for s in self.cdef.body.body if isinstance(s, cst.FunctionDef)}
    own |= set(self.field_names) | {'param', 'variable', 'sow'}  # written by `variables`
    writer = self
    allowed = set()

    class Visitor(cst.CSTVisitor):
      def visit_Call(self, node):
        if writer.writes_has_cache and variables.is_has_cache_variable(node):
          allowed.add(node.func)
        stream = drawn_stream(node)
        if stream is not None and writer.writes_draws:
          if any(i.transform or i.lifted_methods for i in writer.instances):
            writer.fail(node, f'self.make_rng({stream!r}) in a module Linen runs under a lifted transform '
                        '(its keys split per step): not written yet; port it by hand')
          writer.draws.add(stream)
          allowed.add(node.func)

      def visit_Attribute(self, node):
        if (isinstance(node.value, cst.Name) and node.value.value == 'self' and node not in allowed
            and node.attr.value in references.LINEN_MODULE_API and node.attr.value not in own):
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
    """Creation site -> `(expression, the modules made there)`: the expression
    of the method that creates them, or calls the file's function that does
    (`_norm(config, 'attention_norm')`: `self.helpers`)."""
    sites: dict[tracing.Site, tuple[cst.Call, list[tracing.Created]]] = {}
    self.helpers: dict[tracing.Site, helpers.HelperPort] = {}
    for child in (c for instance in self.instances for c in instance.children):
      site = self.site_of(child)
      node = self.file.call_at(site) if site else None
      if site is not None and site != child.site:
        function = helpers.function_at(self.file, child.site.line)
        if not (isinstance(node.func, cst.Name) and node.func.value == function.name.value):
          self.fail(node, f'{child.cls.__name__} {child.name!r} is created by {function.name.value}(...) '
                    'through another function; port it by hand')
        if site not in self.helpers:
          self.helpers[site] = helpers.port_helper(self.file, function, self.cls)
      if node is None:
        self.fail(
            self.method,
            f'{child.cls.__name__} {child.name!r} is not created by an expression of '
            f'{self.cls.__name__}.{self.method.name.value} (created at {child.site}); port it by hand',
        )
      sites.setdefault(site, (node, []))[1].append(child)
    return sites

  def _handed_calls(self) -> dict[cst.Call, handed.HandedCall]:
    """The calls handing the module to a function of the file that makes
    parameters through it (big_vision's `get_posemb(self, ..., 'pos_embedding',
    ...)` calling `self.param`), written where the writer makes its own
    variables (`writes_handed_functions`); refused otherwise, or where the
    function does more through the module."""
    try:
      found = handed.handed_calls(self.file, self.cdef)
    except handed.Refused as e:
      self.fail(e.node, str(e))
    for call in found:
      if not self.writes_handed_functions or not any(call.call is n for n in syntax.descendants(self.method)):
        self.fail(call.call, f'{call.call.func.value}(...) is handed the module and calls {call.held}.param(...) '
                  'in it outside the compact method: NNX makes variables in __init__, which the function does '
                  'not say; write them in the class (self.param(...) there), or port it by hand')
    return {c.call: c for c in found}

  def site_of(self, child: tracing.Created) -> tracing.Site | None:
    """Where the method creates `child`: its own site, or the call of a
    function of the file that made it; None if neither is in the method."""
    method_range = self.file.positions[self.method]

    def in_method(site):
      return (site is not None and site.filename == self.file.path
              and method_range.start.line <= site.line <= method_range.end.line
              and self.file.call_at(site) is not None)

    if in_method(child.site):
      return child.site
    if child.site is None or child.site.filename != self.file.path:
      return None
    if helpers.function_at(self.file, child.site.line) is None:
      return None
    return next((s for s in child.stack[1:] if in_method(s)), None)

  def symbolic_of(self, instance: tracing.Created, own_variables: bool = False) -> shapes.SymbolicTrace:
    """The symbolic trace of `instance`, one per set of submodules made (the
    blocks of a ResNet that have a shortcut, those that do not) and per
    configuration beyond its sizes (a ViT's `classifier='gap'`, which adds
    no class token: its sizes are not the symbolic ones of `'token'`); with
    `own_variables`, per set of its own variables too (a position table a
    flag makes, whose shape only that instance's trace has)."""
    key = (frozenset((c.site, c.name) for c in instance.children),
           frozenset(instance.reserved) if own_variables else None,
           tuple(shapes.beyond_sizes(getattr(instance.module, f)) for f in shapes.module_fields(instance.module)))
    if key not in self._symbolic:
      self._symbolic[key] = self._symbolic_trace(instance)
    return self._symbolic[key]

  def _exclusive(self, node, others) -> bool:
    """Whether `node` and the creation `others` are in two branches of one `if`."""
    if not isinstance(others, cst.Call):
      return False
    theirs = list(self.file.ancestors(others))
    for ancestor in self.file.ancestors(node):
      if isinstance(ancestor, cst.If) and ancestor in theirs and ancestor.orelse is not None:
        in_body = lambda n: ancestor.body in list(self.file.ancestors(n))
        return in_body(node) != in_body(others)
      if ancestor is self.method:
        return False
    return False

  def untraced_raise(self, block: cst.CSTNode) -> cst.BaseSuite:
    """What an untraced branch is written as: it raises, saying why."""
    return self.untraced_branches[block].raising(self.cls.__name__, self.file)

  def field_path(self, expression) -> str | None:
    """`'config.deterministic'` of `self.config.deterministic` (or of
    `config.deterministic` with `config = self.config`): the field, and the
    attributes read from it; None if `expression` reads no field so."""
    names = references.dotted(expression)
    if not names:
      return None
    if names[0] != 'self':
      # (`__call__`'s locals first: a mode read there through `cfg = self.config`.)
      alias = self.locals.get(names[0]) or self.method_locals.get(names[0])
      alias_names = references.dotted(alias) if alias is not None else None
      if not alias_names or alias_names[0] != 'self':
        return None
      names = alias_names + names[1:]
    if len(names) < 2 or names[1] not in self.field_names:
      return None
    return '.'.join(names[1:])

  def inlined_path(self, child: tracing.Created) -> tuple:
    """Where `child`, made as an argument of another creation (an RNN's
    cell, a Sequential's layer), is in the port: the k-th module made at
    its site is an argument of the k-th made at the other's."""
    site = self.site_of(child)
    outer_site, attribute = self.inlined[site]
    inner = [c for c in child.parent.children if self.site_of(c) == site]
    outers = [c for c in child.parent.children if self.site_of(c) == outer_site]
    return self.nnx_path(outers[inner.index(child)]) + attribute

  def made_in_loop(self, site: tracing.Site) -> bool:
    """Whether the port holds the modules made at `site` in a list (made
    in a loop, or as arguments of creations in a loop)."""
    if site in self.inlined:
      return self.made_in_loop(self.inlined[site][0])
    return self.attributes[site][1]

  def loop_index_at(self, child: tracing.Created) -> int:
    """Where in `nnx_path(child)` the index of a looped module is: last,
    or, for one made as another creation's argument, the other's."""
    if self.site_of(child) not in self.inlined:
      return len(self.nnx_path(child)) - 1
    outer_site, attribute = self.inlined[self.site_of(child)]
    return len(self.nnx_path(child)) - len(attribute) - 1

  def sequence_of(self, node: cst.Call) -> cst.Call | None:
    """The creation of a Sequential (a layer with a `sequence_field`)
    whose list `node` is an element of as written, else None."""
    element = self.file.parents.get(node)
    sequence = self.file.parents.get(element)
    arg = self.file.parents.get(sequence)
    outer = self.file.parents.get(arg)
    if not (isinstance(element, cst.Element) and isinstance(sequence, (cst.List, cst.Tuple))
            and isinstance(arg, cst.Arg) and isinstance(outer, cst.Call)):
      return None
    made = helpers.layer_class(self.file, outer.func)
    spec = layers.layer_spec(made) if isinstance(made, type) else None
    if spec is None or spec.sequence_field is None:
      return None
    field = arg.keyword.value if arg.keyword else (
        [f.name for f in dataclasses.fields(made) if f.init][outer.args.index(arg)])
    return outer if field == spec.sequence_field else None

  def dtype_parameter(self, value_name: str, dtype: str) -> str:
    """The constructor keyword for the dtype of `value_name` (a value of the
    call, `inputs`), `dtype` when traced: `inputs_dtype`."""
    name = f'{value_name}_dtype'
    while name in self.field_names:  # (input sizes are `in_features`, `x_shape`: no clash)
      name += '_'
    if self.dtype_parameters.setdefault(name, dtype) != dtype:
      self.fail(None, f'{value_name}.dtype was {self.dtype_parameters[name]} and {dtype} in the traces; '
                'port it by hand')
    return name

  def _assemble(self, init_body, methods: dict) -> ClassPort:
    """The NNX class: `__init__` from `init_body` where the creating method
    was, then the class's other statements, `methods` rewritten."""
    init_writer = constructor.Constructor(self)
    inputs = init_writer.input_parameters()
    fields = [
        f for f in constructor.declared_fields(self.cdef, self.cls, self.file, self.field_names)
        if f.target.value not in self.mode_flags.fields  # a flag inside a field leaves the field
    ]
    init = init_writer.init_method(fields, inputs, init_body)
    placeholders = {}
    for parameter in inputs:
      for dim in range(parameter.ndim):
        axis = dim - parameter.ndim if dim == parameter.ndim - 1 else dim - (not parameter.with_batch)
        placeholders[f'__input_{parameter.index}_{dim}'] = (
            f'{parameter.name}[{axis}]' if parameter.whole_shape else parameter.name)
    init = init.visit(syntax.Substitute(placeholders)).visit(syntax.DropSelfAssignments())
    init = init.with_changes(body=init.body.with_changes(
        body=syntax.through_aliases(list(init.body.body), set(self.field_names))))
    # `__init__` is the port's own code: laid out as Flax's code is.
    init = init.with_changes(body=init.body.visit(
        syntax.LaidOut(self.file.module.default_indent, 2 * self.file.module.default_indent)))
    init, init_cache = caches.split_init(init, self, {p.name for p in inputs})
    body = []
    for statement in self.cdef.body.body:
      if statement is self.method:
        body.append(init)
        if init_cache is not None:
          body.append(init_cache)
        if statement in methods:
          body.append(methods[statement])
      elif statement in methods:
        body.append(methods[statement])
      elif isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.AnnAssign):
        continue  # a field: the constructor takes it
      elif isinstance(statement, cst.FunctionDef):
        body.append(statement.visit(_CarryOfOwnCell(self)).visit(_Draws()))
      else:
        body.append(statement)
    # `__init__` (and `init_cache`) before the other methods, as NNX classes are read.
    made = [init] + ([init_cache] if init_cache is not None else [])
    first = next((k for k, s in enumerate(body) if isinstance(s, cst.FunctionDef)), len(body))
    if body[first:first + len(made)] != made:
      body = body[:first] + made + [s for s in body[first:] if all(s is not m for m in made)]
    # A blank line before each method after the first, as PEP 8 spaces them
    # (the Linen class's first method had none before it).
    body = [s.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) if isinstance(s, cst.FunctionDef) and k > first
            and not s.leading_lines else s for k, s in enumerate(body)]
    bases = [
        b.with_changes(value=syntax.expression('nnx.Module'))
        if references.is_linen(b.value, self.file, 'Module') else b
        for b in self.cdef.bases
    ]
    node = self.cdef.with_changes(bases=bases, body=self.cdef.body.with_changes(body=body))
    if self.mode_flags.merged:
      node = node.visit(_FirstFrom(self.mode_flags.merged))
    node = node.visit(references.LinenReferences(self.file, self.cls, strict=False))
    node = _without_dead_fields(
        node, [n for n in self.field_names if n not in self.mode_flags.fields and n not in self._read_elsewhere()])
    self.mode_flags.check_fields_gone(node, init)
    return ClassPort(self.cls, node, self.attributes, inputs, self.mode_flags.call, self.params, self,
                     dict(self.mode_flags.fields),
                     {**{h.node.name.value: h.node for h in self.helpers.values()},
                      **{c.function.name.value: handed.nnx_function(c.function, c.held).visit(
                          references.LinenReferences(self.file, None, strict=False))
                         for c in self.handed_calls.values()}},
                     init_cache is not None,
                     [c.visit(references.LinenReferences(self.file, self.cls, strict=False))
                      for c in self.constants])

  def _read_elsewhere(self) -> set[str]:
    """The class's fields the file reads off something else than `self`
    (`self.encoder.config`, `model.features`): kept on the port."""
    return set(self.field_names) & self.file.attributes_read_off_others

  def _own_variables(self) -> dict[cst.Call, variables.OwnVariable]:
    """`self.param(...)` / `self.variable(...)` calls of the method, written."""
    found: list[cst.Call] = []
    self.method.body.visit(syntax.CallsWhere(variables.is_own_variable_call, found))
    own = {}
    taken = {a for a, _ in self.attributes.values()} | set(self.field_names)
    made = {node for node, _ in self.sites.values()} | set(self.lift_calls)
    for call in found:
      # A variable of a branch no configuration took (`if self.pool_type ==
      # 'tok':`, its class token): that branch raises, as one making modules.
      if self._in_untraced_branch(call, made):
        continue
      if self.loops_around(call):
        self.fail(call, f'self.{call.func.attr.value}(...) in a loop; port it by hand')
      variable = variables.own_variable(call, self)
      self._claim(variable, taken, call)
      own[call] = variable
    self.handed_variables = self._handed_variables(taken, made)
    return own

  def _in_untraced_branch(self, call: cst.Call, made) -> bool:
    """Whether `call` is in a branch no configuration took (`made`: the
    creations the trace saw), which then raises, as one making modules."""
    branch = branches.untraced_branch(call, self.method, self.file, self.instances, self.call_time, made)
    if branch is not None:
      self.untraced_branches[branch.block] = branch
      return True
    return any(b in self.untraced_branches for b in self.file.ancestors(call))

  def _claim(self, variable: variables.OwnVariable, taken: set[str], call: cst.Call) -> None:
    """Adds the attribute names `variable` takes (each instance's, for one
    a field names) to `taken`, refusing one already taken."""
    names = {getattr(i.module, variable.named_by) for i in self.instances} if variable.named_by else {variable.name}
    if names & taken:
      self.fail(call, f'{sorted(names & taken)[0]!r} names both a variable and another attribute; port it by hand')
    taken |= names

  def _handed_variables(self, taken: set[str], made: set) -> dict[cst.Call, list[tuple[cst.BaseExpression | None,
                                                                           variables.OwnVariable]]]:
    """The parameters each handed call makes (`handed_calls`): the test
    under which it does (None: always), and the variable, as one of the
    class's own (`taken`: the attribute names so far; `made`: the
    creations the trace saw)."""
    found = {}
    for call, handed_call in self.handed_calls.items():
      # In a branch no configuration took (`if self.use_pos:` never set).
      if self._in_untraced_branch(call, made):
        continue
      if self.loops_around(call):
        self.fail(call, f'{call.func.value}(...), handed the module, in a loop; port it by hand')
      written = []
      for through in handed_call.made:
        if through.test is not None and source.names_in(through.test) & self.call_time:
          self.fail(call, f'{call.func.value}(...) makes a parameter through the module when '
                    f'{syntax.code_of(through.test)}, which reads the call; port it by hand')
        variable = variables.own_variable(through.call, self, where=call)
        self._claim(variable, taken, call)
        written.append((through.test, variable))
      found[call] = written
    return found

  def creation_named(self, node: cst.BaseExpression) -> cst.Call | None:
    """The creation a local of the method names, bound to it once (`block`
    of `block = Block(...)`); None for anything else."""
    bound = self.method_locals.get(node.value) if isinstance(node, cst.Name) else None
    return bound if bound is not None and bound in self.node_sites else None


class _FirstFrom(cst.CSTTransformer):
  """Each merge of a flag in `names` as NNX merges it (`first_from`)."""

  def __init__(self, names: set[str]):
    self.names = names

  def leave_Call(self, original, updated):
    return first_from(updated) if mode_flags.merged_name(original) in self.names else updated


class _CarryOfOwnCell(cst.CSTTransformer):
  """`nn.LSTMCell(self.features, parent=None).initialize_carry(key, shape)`
  (a cell made only to ask it for a carry) as the NNX cell the module holds,
  made with the same arguments, asked for it:
  `self.lstm_cell_0.initialize_carry(shape, nnx.Rngs(key))`. Only where the
  carry is zeros (no `carry_init` given: Linen's default and NNX's), so the
  keys, which Linen and NNX split otherwise, do not matter."""

  def __init__(self, writer: ClassWriter):
    self.writer = writer

  def leave_Call(self, original, updated):
    func = updated.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == 'initialize_carry'
            and isinstance(func.value, cst.Call) and len(updated.args) == 2
            and all(a.keyword is None and not a.star for a in updated.args)):
      return updated
    made = func.value
    cls = helpers.layer_class(self.writer.file, made.func)
    spec = layers.layer_spec(cls) if isinstance(cls, type) else None
    args = [a for a in made.args if not (a.keyword is not None and a.keyword.value == 'parent'
                                         and isinstance(a.value, cst.Name) and a.value.value == 'None')]
    if spec is None or spec.input_index != 1 or len(args) != len(made.args) - 1 or any(
        a.keyword is not None and a.keyword.value == 'carry_init' for a in args):
      return updated
    code = self.writer.file.module.code_for_node
    same = [
        site for site, (node, children) in self.writer.sites.items()
        if children and all(c.cls is cls for c in children) and isinstance(node, cst.Call)
        and [code(a.value) for a in node.args] == [code(a.value) for a in args]
        and [a.keyword and a.keyword.value for a in node.args] == [a.keyword and a.keyword.value for a in args]
    ]
    if len(same) != 1 or self.writer.attributes[same[0]][1]:
      return updated
    rng, shape = updated.args
    return syntax.expression(
        f'self.{self.writer.attributes[same[0]][0]}.initialize_carry({code(shape.value)}, nnx.Rngs({code(rng.value)}))')


def _without_dead_fields(node: cst.ClassDef, fields: list[str]) -> cst.ClassDef:
  """The class without `self.<field> = <field>` in `__init__` for a field
  nothing reads (`self.features` where only `__init__` used `features`);
  all kept where the class reads its attributes by name (`getattr(self, ...)`)."""
  read: set[str] = set()
  kept: set[cst.CSTNode] = set()  # the assignments `self.x = x` themselves

  class Reads(cst.CSTVisitor):
    def visit_Assign(self, n):
      if _is_field_assignment(n, fields):
        kept.add(n.targets[0].target)

    def visit_Attribute(self, n):
      if isinstance(n.value, cst.Name) and n.value.value == 'self' and n not in kept:
        read.update(fields if n.attr.value == '__dict__' else {n.attr.value})

    def visit_Call(self, n):
      if isinstance(n.func, cst.Name) and n.func.value in ('getattr', 'vars', 'setattr'):
        read.update(fields)

  node.visit(Reads())
  dead = set(fields) - read

  class Drop(cst.CSTTransformer):
    def leave_SimpleStatementLine(self, original, updated):
      if (len(original.body) == 1 and isinstance(original.body[0], cst.Assign)
              and _is_field_assignment(original.body[0], dead)):
        return cst.RemoveFromParent()
      return updated

  return node.visit(Drop()) if dead else node


def _is_field_assignment(assign: cst.Assign, fields) -> bool:
  """`self.x = x` for a field `x`."""
  target = assign.targets[0].target if len(assign.targets) == 1 else None
  return (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == 'self'
          and target.attr.value in fields and isinstance(assign.value, cst.Name)
          and assign.value.value == target.attr.value)


def first_from(node: cst.Call) -> cst.Call:
  """`nn.module.merge_param('deterministic', self.deterministic, deterministic)`
  as NNX's layers merge their modes: the argument, else the attribute
  (`first_from(deterministic, self.deterministic, error_msg=...)`). Linen
  refuses both given; NNX's `model.eval()` sets the attribute of every
  module, so there the argument must win (where Linen would run, both agree)."""
  name = node.args[0].value.evaluated_value
  return syntax.expression(
      f"first_from({name}, self.{name}, error_msg='{name}: not given, nor set by model.eval()')")


class _Draws(cst.CSTTransformer):
  """`self.make_rng('noise')` in a method of the class other than the one
  `__call__` is written from (a `token_drop` helper) as NNX draws it."""

  def leave_Call(self, original, updated):
    return draw(original) if drawn_stream(original) is not None else updated


def drawn_stream(node: cst.CSTNode) -> str | None:
  """`'noise'` of `self.make_rng('noise')` (a string the code spells out),
  else None."""
  if not (isinstance(node, cst.Call) and references.dotted(node.func) == ['self', 'make_rng']
          and len(node.args) == 1 and node.args[0].keyword in (None,)
          and isinstance(node.args[0].value, cst.SimpleString)):
    return None
  stream = node.args[0].value.evaluated_value
  return stream if isinstance(stream, str) and stream.isidentifier() and stream != 'params' else None


def draw(node: cst.Call) -> cst.Call:
  """`self.make_rng('noise')` as NNX draws it: `self.rngs.noise()`."""
  return cst.Call(syntax.expression(f'self.rngs.{drawn_stream(node)}'), [])



def is_field_alias(statement, fields) -> bool:
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


