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
import functools
import inspect
from collections.abc import Sequence

import libcst as cst
from flax import linen as nn

from converters.port import (
  branches,
  caches,
  factories,
  handed,
  helpers,
  layers,
  references,
  shapes,
  source,
  shared_scopes,
  switched_sizes,
  syntax,
  tracing,
  transforms,
  variables,
)
from converters.port.errors import UntracedCreation, Untranslatable


@dataclasses.dataclass
class InputParameter:
  """A constructor argument made of input sizes: `in_features` (one size) or
  `<argument>_shape` (the shape of one example of the argument at `index`,
  its first axis, the batch, left out, as Keras's `input_shape`), or, where
  a size depends on that axis too, `<argument>_shape_with_batch`."""

  name: str
  index: int
  ndim: int
  whole_shape: bool
  with_batch: bool = False


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
  inputs: list[InputParameter]
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


def declared_fields(cdef: cst.ClassDef, cls: type, file: source.SourceFile, names: Sequence[str]) -> list[cst.AnnAssign]:
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


class ClassWriter:
  """Writes one class: see the module docstring. Subclasses say where the
  creations are (`_methods`, `_loops`, `_attributes`, `nnx_path`) and
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
    self.field_modes: dict[str, bool] = {}
    self._mode_reads: set = set()  # the expressions read as modes
    self.params = [p.name.value for p in self.call.params.params[1:]] + [
        p.name.value for p in self.call.params.kwonly_params
    ]
    self.call_time = self._call_time()
    self.locals = syntax.assigned_once(self.call.body)
    self.merged_flags = self._merged_flags()
    for name in sorted(self.merged_flags):
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
    #: The code of statements binding a dict a creation spreads (`**inits`).
    self.spread: set[str] = set()
    #: Linen variable name -> the NNX attribute holding it, where they differ
    #: (`self.table = self.param('embedding', ...)` in `setup()`).
    self.variable_attributes: dict[str, str] = {}
    self.sites = self._sites()
    self.handed_calls = self._handed_calls()
    self.callees = factories.Callees(self.file, instance.module, tuple(self.field_names), self.method_locals)
    found = factories.read(self.sites, self.callees, self.keeps_factories, self.fail)
    self.factories, self.lifts, self.lift_calls = found.partials, found.lifts, found.lift_calls
    self.kept_factories = self._kept_factories()
    # Flax layer classes (or partials of them) handed to the user's blocks.
    self.handed = factories.handed_classes(self.sites, self.file)
    # Fields the model is configured with a module class or partial in
    # (`conv: ModuleDef`): field -> the Flax layer (its spec) or the user's
    # class the traced configuration makes through it.
    self.factory_fields: dict[str, object] = {}
    self._check_untraced_creations()
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
    self.used_dims: set[shapes.InputDim] = set()
    #: Keywords of the constructor for dtypes Linen reads off the call
    #: (`inputs.dtype`): name -> its default, the traced dtype's name.
    self.dtype_parameters: dict[str, str] = {}
    self._tables: dict[int, shapes.SymbolTable] = {}
    # Sites of modules created as another creation's argument (an RNN's
    # cell): site -> (the creation's site, the NNX attribute holding it).
    self.inlined: dict = {}

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

  @staticmethod
  def _argument(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    for arg in call.args:
      if arg.keyword is not None and arg.keyword.value == keyword:
        return arg.value
    return None

  # --- sizes

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

  def use_input_dim(self, index: int, dim: int) -> None:
    """The constructor takes dimension `dim` of array input `index`."""
    array = self.instance.calls[0].args[index]
    name = self.params[index] if index < len(self.params) else f'arg{index}'
    self.used_dims.add(shapes.InputDim(index, name, dim, len(array.shape), array.shape[dim]))

  def size_source(self, value, table: shapes.SymbolTable | None = None) -> str:
    if isinstance(value, shapes.Unfitted):
      self.fail(None, f'a size Linen infers changes with {value.what} in a way the port cannot '
                'write (it holds at the traced value only); port it by hand')
    table = table or self.symbolic.table
    for name in table.symbols_in(value):
      origin = table.origins[name]
      if isinstance(origin, shapes.InputDim):
        self.used_dims.add(origin)
    return table.source(value, self._origin_placeholder)

  @staticmethod
  def _origin_placeholder(origin) -> str:
    if isinstance(origin, shapes.FieldLength):
      return f'len({shapes.access_source(origin.access)})'
    if isinstance(origin, shapes.FieldValue):
      return shapes.access_source(origin.access, origin.last)
    return f'__input_{origin.index}_{origin.dim}'

  def _symbolic_child(self, child: tracing.Created) -> tracing.Created:
    """`child` in the symbolic trace of the instance that created it (its
    table is `self._table[id(...)]`)."""
    trace = self.symbolic_of(child.parent)
    if child.shares_scope:  # named as its parent is: the k-th such child
      ours = [c for c in child.parent.children if c.shares_scope]
      theirs = [c for c in trace.root.children if c.shares_scope]
      candidates = theirs[ours.index(child):][:1] if len(ours) == len(theirs) else []
    else:
      candidates = [c for c in trace.root.children if c.name == child.name]
    for candidate in candidates:
      self._tables[id(candidate)] = trace.table
      return candidate
    self.fail(None, f'{child.name} is not created when the sizes are symbolic; port it by hand')

  def _child_size(self, symbolic_child, value) -> str:
    return self.size_source(value, self._tables[id(symbolic_child)])

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

  def _check_untraced_creations(self) -> None:
    """A module class called in the method where no trace went (a branch no
    configuration tried) is refused, it would stay a Linen creation; but
    for a branch of an `if` on the configuration that creates nothing
    traced (a hybrid model's ResNet root, the trace without it), which the
    port writes to raise (`untraced_branches`)."""
    made = {node for node, _ in self.sites.values()} | set(self.lift_calls)
    made |= {p for p in self.factories.values()}
    module = self.instance.module
    writer = self

    def module_class(func) -> bool:
      names = references.dotted(func)
      if names and names[0] == 'self' and len(names) == 2 and names[1] in writer.field_names:
        value = getattr(module, names[1], None)
      elif isinstance(func, cst.Name) and func.value in writer.factories:
        return True
      else:
        value = helpers.layer_class(writer.file, func)
      if isinstance(value, functools.partial):
        value = value.func
      return isinstance(value, type) and issubclass(value, nn.Module)

    untraced, transforms_of_modules = [], []

    class Visitor(cst.CSTVisitor):
      def visit_Call(self, node):
        if node in made:
          return
        if module_class(node.func):
          untraced.append(node)
        elif (references.linen_transform(node, writer.file) and node.args and module_class(node.args[0].value)
              and not any(a in made for a in writer.file.ancestors(node))):
          transforms_of_modules.append(node)  # `nn.remat(Block)`: untraced where a branch no one took holds it

    self.method.body.visit(Visitor())
    #: Blocks of an `if` on the configuration creating only what no trace
    #: made: `__init__` and `__call__` raise there (`untraced_raise`).
    self.untraced_branches: dict[cst.CSTNode, branches.UntracedBranch] = {}
    for node in transforms_of_modules:
      # (Elsewhere, one a creation reads through a local, the check of Linen's
      # names refuses it, saying what it is.)
      branch = branches.untraced_branch(node, self.method, self.file, self.instances, self.call_time, made)
      if branch is not None:
        self.untraced_branches[branch.block] = branch
    for node in untraced:
      branch = branches.untraced_branch(node, self.method, self.file, self.instances, self.call_time, made)
      if branch is None:
        raise UntracedCreation(self.cls, self.file.line_of(node), (
            f'{self.file.code(node.func)}(...) is created where no traced configuration went; port it by hand '
            '(or trace a configuration that takes it)'))
      self.untraced_branches[branch.block] = branch
    for block, branch in list(self.untraced_branches.items()):
      why = next((why for group, why in self.refused
                  if any(branches.taken_by(branch, self.file, instance) for instance in group)), None)
      if why is not None:
        self.untraced_branches[block] = dataclasses.replace(branch, refused=why)

  def untraced_raise(self, block: cst.CSTNode) -> cst.BaseSuite:
    """What an untraced branch is written as: it raises, saying why."""
    return self.untraced_branches[block].raising(self.cls.__name__, self.file)

  def _nnx_handed(self, value: cst.BaseExpression) -> cst.BaseExpression:
    """A value `factories.handed_classes` found, as NNX's: `nnx.Linear`, or the
    partial as `nnx_factory` writes one."""
    if isinstance(value, cst.Call):
      return self._nnx_partial(value, self.file.code(value))
    return syntax.expression(layers.layer_spec(helpers.layer_class(self.file, value)).written)

  def _kept_factories(self) -> set[str]:
    """The factory locals the method reads as values, not only as what its
    creations call (`conv=conv` handed to a block, as Flax's ResNet hands
    its `conv` and `norm`): `__init__` keeps them, as NNX partials
    (`nnx_factory`), and the creations through them are written through
    them. Their mode arguments (`use_running_average=not train`) leave
    them for the NNX mode, so they are not of the call."""
    callees = {node.func for node, _ in self.sites.values()}
    partials = self.factories
    read: set[str] = set()

    class Reads(cst.CSTVisitor):
      def visit_AssignTarget(self, node):
        return False

      def visit_Name(self, node):
        if node.value in partials and node not in callees:
          read.add(node.value)

    if not self.keeps_factories:
      return set()
    self.method.body.visit(Reads())
    pending = [name for name in partials if name in read]
    for name in pending:
      head = partials[name].args[0].value
      if isinstance(head, cst.Name) and head.value in partials:
        self.fail(partials[name], f'{name} is a partial of the partial {head.value}; write it as one '
                  'partial, or port it by hand')
    # A partial may hand on another (`block = partial(Block, norm=norm)`):
    # repeated until none is left of the call, whatever their order.
    while True:
      leave = [
          name for name in pending
          if not any(self.call_time & source.names_in(a.value) for a in partials[name].args
                     if not (a.keyword is not None and a.keyword.value in self._factory_modes(partials[name])))
      ]
      if not leave:
        return read
      for name in leave:
        self.call_time.discard(name)
        pending.remove(name)

  def _factory_modes(self, partial: cst.Call) -> dict[str, bool]:
    """The fields of a factory's class its mode sets: field -> whether True
    is the eval mode (`use_running_average` of a BatchNorm)."""
    cls = factories.factory_class(self.callees.target(partial.args[0].value))
    spec = layers.layer_spec(cls) if cls is not None else None
    if spec is not None:
      return dict(spec.mode)
    port = self.child_ports.get(cls)
    return {} if port is None else {f: not train for f, train in port.field_modes.items()}

  def nnx_factory(self, name: str) -> cst.Call:
    """A kept factory as `__init__` writes it: `partial(nn.BatchNorm,
    use_running_average=not train, momentum=0.9)` -> `partial(nnx.BatchNorm,
    momentum=0.9)` (Linen's class as NNX's, the mode arguments left to the
    NNX mode, fields NNX names otherwise renamed)."""
    return self._nnx_partial(self.factories[name], name)

  def _nnx_partial(self, partial: cst.Call, name: str) -> cst.Call:
    """`partial` (`name` says what it is in messages) as NNX's: see `nnx_factory`."""
    head = partial.args[0].value
    target = self.callees.target(head)
    cls = factories.factory_class(target)
    spec = layers.layer_spec(cls) if cls is not None else None
    names = references.dotted(head)
    from_field = bool(names) and names[0] == 'self'
    if cls is None or (spec is None and cls not in self.child_ports):
      self.fail(partial, f'{name} = {self.file.code(partial)} makes no module the port writes; port it by hand')
    if not from_field and spec is not None:
      head = syntax.expression(spec.written)
    elif not from_field and not (isinstance(head, cst.Name) and head.value == cls.__name__):
      self.fail(partial, f'{name} is a partial of {self.file.code(head)}, which is not the class by its own '
                'name; port it by hand')
    modes = self._factory_modes(partial)
    args = [cst.Arg(head)]
    for arg in partial.args[1:]:
      if arg.star or arg.keyword is None:
        self.fail(partial, f'{name} = {self.file.code(partial)} passes arguments by position; NNX\'s '
                  'constructors take the input size first: port it by hand')
      field = arg.keyword.value
      if field in modes:
        self._mode_argument(arg.value, modes[field], partial)
        continue
      if self.call_time & source.names_in(arg.value):
        self.fail(partial, f'{field}={self.file.code(arg.value)} of {name} depends on the inputs of the call; '
                  'port it by hand')
      nnx_name = spec.nnx_argument(field) if spec is not None else field
      if spec is not None and nnx_name not in spec.nnx_parameters():
        self.fail(partial, f'{spec.nnx} has no argument {nnx_name!r} for Linen\'s {field!r}; port it by hand')
      args.append(syntax.keyword(nnx_name, arg.value))
    if len(args) == 1:
      return head  # nothing left but the mode: the class itself (`BlockD`, not `partial(BlockD)`)
    return partial.with_changes(args=syntax.normalised(args))

  def _given_by_factory(self, node: cst.Call) -> set[str]:
    """The Linen fields a kept factory the creation goes through sets."""
    if isinstance(node.func, cst.Name) and node.func.value in self.kept_factories:
      return {a.keyword.value for a in self.factories[node.func.value].args[1:] if a.keyword is not None}
    return set()

  def _field_factory(self, node: cst.Call, func: cst.BaseExpression, children) -> str | None:
    """The field a creation calls (`self.conv(...)`, `self.block_cls(...)`),
    checked: each instance's value a class or a partial with keywords only,
    the same class at every creation. None for a creation that is not one."""
    names = references.dotted(func)
    if not (names and names[0] == 'self' and len(names) == 2 and names[1] in self.field_names):
      return None
    field = names[1]
    for instance in self.instances:
      value = getattr(instance.module, field)
      while isinstance(value, functools.partial):
        if value.args:
          self.fail(node, f'the field {field!r} holds a partial with positional arguments; NNX\'s '
                    'constructors take the input size first: port it by hand')
        value = value.func
    if len({c.cls for c in children}) != 1:
      self.fail(node, f'the field {field!r} makes modules of several classes ('
                f'{", ".join(sorted({c.cls.__name__ for c in children}))}); port it by hand')
    cls = children[0].cls
    made = layers.layer_spec(cls) or cls
    if self.factory_fields.setdefault(field, made) is not made:
      self.fail(node, f'the field {field!r} makes both {_made_name(made)} and '
                f'{_made_name(self.factory_fields[field])}; port it by hand')
    if isinstance(made, layers.LayerSpec) and made.linen_defaults:
      self.fail(node, f'{cls.__name__} made through the field {field!r}: NNX\'s {made.nnx} wants '
                f'{", ".join(made.linen_defaults)} where Linen has a default, which the field\'s value '
                'may set; port it by hand')
    for instance in self.instances:
      if instance.parent is None:  # the user's value (a parent's is its port's)
        self._check_configured(node, field, getattr(instance.module, field))
    return field

  def _check_configured(self, node, field: str, value) -> None:
    """A partial the model is configured with in `field` that its NNX
    counterpart (`prove.nnx_value`) keeps whole: no mode fixed in it (NNX
    sets modes for every layer, `model.train()`), no argument NNX's class
    has not."""
    while isinstance(value, functools.partial):
      cls = factories.factory_class(value)
      spec = layers.layer_spec(cls)
      port = self.child_ports.get(cls)
      modes = dict(spec.mode) if spec is not None else dict(port.field_modes) if port is not None else {}
      for keyword in value.keywords:
        if keyword in modes:
          self.fail(node, f'the field {field!r} holds a partial fixing {keyword}={value.keywords[keyword]!r}, '
                    'a mode NNX sets for every layer (model.train() / .eval()); port it by hand')
        if spec is not None and spec.nnx_argument(keyword) not in spec.nnx_parameters():
          self.fail(node, f'the field {field!r} holds a partial with {keyword}=, which {spec.nnx} does not '
                    'take; port it by hand')
      value = value.func

  def expanded(self, node: cst.Call) -> cst.Call:
    """A creation through a factory as the direct creation it stands for:
    `norm(name='n')` with `norm = partial(nn.BatchNorm, momentum=0.9)` is
    `nn.BatchNorm(momentum=0.9, name='n')` (keywords of the call win)."""
    if not (isinstance(node.func, cst.Name) and node.func.value in self.factories):
      return node
    if node.func.value in self.kept_factories:
      return node  # written through the partial `__init__` keeps
    partial = self.factories[node.func.value]
    given = {a.keyword.value for a in node.args if a.keyword is not None}
    positional = [a for a in partial.args[1:] if a.keyword is None] + [a for a in node.args if a.keyword is None]
    keywords = [a for a in partial.args[1:] if a.keyword is not None and a.keyword.value not in given]
    keywords += [a for a in node.args if a.keyword is not None]
    return cst.Call(partial.args[0].value, syntax.normalised(positional + keywords))

  def _linen_arguments(self, node: cst.Call, cls: type) -> list[tuple[str, cst.Arg]]:
    """`(field, arg)` of a Linen creation's arguments, positional ones named."""
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    node = self.expanded(node)
    out = []
    for i, arg in enumerate(node.args):
      layer = layers.is_flax_class(cls) or layers.layer_spec(cls) is not None
      if arg.star == '**' and not layer and not self.call_time & source.names_in(arg.value):
        # `Encoder(**self.transformer)`: a user's class takes its fields by
        # name in NNX too (`_module_creation` checks none is its mode).
        out.append(('**', arg))
        continue
      if arg.star == '**' and (named := self._named_arguments(arg.value)) is not None:
        out += [(a.keyword.value, a) for a in named]  # `**inits`, `inits = dict(kernel_init=...)`
        continue
      if arg.star == '**' and layer and (chosen := self._chosen_arguments(arg.value)) is not None:
        out.append(('**', arg.with_changes(value=chosen)))  # `kw = {...} if self.zeroinit else {}`
        continue
      if arg.star:
        self.fail(node, f'*args or **kwargs in the creation of {cls.__name__}; port it by hand')
      out.append((arg.keyword.value if arg.keyword else fields[i], arg))
    return out

  def _named_arguments(self, value: cst.BaseExpression) -> list[cst.Arg] | None:
    """The keyword arguments of a dict of names spread into a creation, as
    written (`{'kernel_init': ...}`), or held by a local the method binds
    once (`inits = dict(kernel_init=..., bias_init=...)`); else None."""
    bound = self._spread_binding(value)
    return None if bound is None else _keyword_dict(bound)

  def _chosen_arguments(self, value: cst.BaseExpression) -> cst.IfExp | None:
    """A choice on the configuration between two dicts of names spread into
    a creation (`kw = {'kernel_init': nn.initializers.zeros} if
    self.head_zeroinit else {}`, big_vision's head), written out or held by
    a local the method binds once: the choice, each side a dict literal of
    string keys; else None."""
    bound = self._spread_binding(value)
    if not isinstance(bound, cst.IfExp) or self.call_time & source.names_in(bound.test):
      return None
    sides = [_keyword_dict(bound.body), _keyword_dict(bound.orelse)]
    if any(side is None for side in sides):
      return None
    body, orelse = (cst.Dict([cst.DictElement(cst.SimpleString(repr(a.keyword.value)), a.value) for a in side])
                    for side in sides)
    return bound.with_changes(body=body, orelse=orelse)

  def _spread_binding(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """What a `**value` spreads: the expression itself, or what the local it
    names is bound to once and read only where it is spread (whose
    statement then leaves `__call__`); None for a local read otherwise."""
    bound = self.method_locals.get(value.value) if isinstance(value, cst.Name) else value
    if bound is not None and bound is not value:
      # Read only where it is spread: a dict changed after it is bound
      # (`inits['bias_init'] = ...`) is not what its binding says.
      reads = [n for n in syntax.descendants(self.method) if isinstance(n, cst.Name) and n.value == value.value]
      spread = [a.value for a in syntax.descendants(self.method) if isinstance(a, cst.Arg) and a.star == '**'
                and isinstance(a.value, cst.Name) and a.value.value == value.value]
      if len(reads) != len(spread) + 1:  # the spreads and the binding
        return None
      # Its statement may go from `__call__` once nothing else reads it.
      self.spread.update(syntax.code_of(n) for n in syntax.descendants(self.method) if isinstance(
          n, cst.SimpleStatementLine) and any(isinstance(b, cst.Assign) and b.value is bound for b in n.body))
    return bound

  def _mode_argument(self, value: cst.BaseExpression, eval_value: bool, node) -> None:
    """Checks that a mode field's value is a call flag or a bool field of
    the module (or its negation) and records its value in training."""
    if self._reads_merged_flag(value):
      self.fail(node, f'{self.file.code(value)} sets a layer\'s mode where it is created, from the flag '
                'merged with the field of its name: give it where the layer is called '
                '(`layer(x, deterministic=deterministic)`), or port it by hand')
    negated = isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Not)
    inner = value.expression if negated else value
    train_value = eval_value if negated else not eval_value
    path = self.field_path(inner)
    self._mode_reads.add(inner)
    if path is not None and all(isinstance(_value_at(i.module, path), bool) for i in self.instances):
      # A flag of the configuration (`self.deterministic`,
      # `config.deterministic`) handed on to the layers: the port's mode too.
      if self.field_modes.setdefault(path, train_value) != train_value:
        self.fail(node, f'{path} sets modes both ways; port it by hand')
      return
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
          'argument of __call__ or a bool field; port it by hand (NNX sets it with '
          'model.train() / .eval())',
      )
    if self.modes.setdefault(inner.value, train_value) != train_value:
      self.fail(node, f'{inner.value} sets modes both ways; port it by hand')

  def without_input_reads(self, expression: cst.BaseExpression) -> cst.BaseExpression | None:
    """`expression` with the locals it reads inlined and every read of an
    input's size (`inputs.shape[-1]`) written as that size (`in_features`),
    so that `__init__` can compute it; None if it reads the call otherwise."""
    inputs = self.symbolic.root.calls[0].args
    writer = self
    # An argument bound again in the method (`x = nn.Dense(...)(x)`) is not
    # the input any more where the shape is read: refused, not guessed.
    first_bound: dict[str, int] = {}  # argument -> the first line binding it again

    rebinding: dict[str, list] = {}  # argument -> the statements binding it again

    class Bindings(cst.CSTVisitor):
      def bind(self, node, target):
        for name in syntax.target_names(target):
          if name in writer.params and node in writer.file.positions:
            line = writer.file.positions[node].start.line
            first_bound[name] = min(first_bound.get(name, line), line)
            rebinding.setdefault(name, []).append(node)

      def visit_AssignTarget(self, node):
        self.bind(node, node.target)

      def visit_AnnAssign(self, node):  # `x: jax.Array = nn.Dense(w)(x)`
        self.bind(node, node.target)

      def visit_AugAssign(self, node):
        self.bind(node, node.target)

    self.call.body.visit(Bindings())

    def rebound_before(name: str, node) -> bool:
      line = self.file.positions[node].start.line if node in self.file.positions else None
      if name in first_bound and (line is None or first_bound[name] <= line):
        return True
      # In a loop that binds it again, a later turn reads another value.
      loops = [a for a in self.file.ancestors(node) if isinstance(a, (cst.For, cst.While))] if line else []
      return any(loop in self.file.ancestors(b) for loop in loops for b in rebinding.get(name, ()))

    class Rewrite(cst.CSTTransformer):
      def leave_Subscript(self, original, updated):
        value = updated.value
        if (isinstance(value, cst.Attribute) and value.attr.value == 'shape'
            and isinstance(value.value, cst.Name) and value.value.value in writer.params
            and len(updated.slice) == 1 and isinstance(updated.slice[0].slice, cst.Index)):
          index = updated.slice[0].slice.value
          negative = isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.Minus)
          number = index.expression if negative else index
          position = writer.params.index(value.value.value)
          if rebound_before(value.value.value, original):
            return updated
          if isinstance(number, cst.Integer) and position < len(inputs) and hasattr(inputs[position], 'shape'):
            # The input's size: an argument of the constructor (`in_features`).
            ndim = len(inputs[position].shape)
            dim = ((-1 if negative else 1) * int(number.value)) % ndim
            writer.use_input_dim(position, dim)
            return cst.Name(f'__input_{position}_{dim}')
        return updated

      def visit_Attribute(self, node):
        attributes.add(node.attr)  # `self.out_dim`: not the local `out_dim`

      def leave_Name(self, original, updated):
        alias = writer.locals.get(updated.value)
        if original in attributes:
          return updated
        if updated.value in writer.call_time and alias is not None and updated.value not in writer.params:
          inlined = alias.visit(Rewrite())
          atomic = (cst.Name, cst.Tuple, cst.List, cst.Call, cst.Attribute, cst.Subscript, cst.Integer)
          return inlined if isinstance(inlined, atomic) else inlined.with_changes(
              lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated

    attributes: set[cst.Name] = set()
    rewritten = expression.visit(Rewrite())
    if source.names_in(rewritten) & self.call_time:
      return None
    return rewritten

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

  def _creation(self, site: tracing.Site) -> cst.BaseExpression:
    """The NNX expression creating the modules of `site`."""
    node, children = self.sites[site]
    child = children[0]
    spec = layers.layer_spec(child.cls)
    if site in self.helpers:
      size = None
      if self.helpers[site].size_parameter is not None:
        size = self._in_size(site, node, self._feature_axis_of(node))
      for arg in node.args:
        if self.call_time & source.names_in(arg.value):
          self.fail(node, f'{self.file.code(arg.value)} depends on the inputs of the call; port it by hand')
      return self.helpers[site].call(node, size)
    func = self.expanded(node).func
    # Made through what the model is configured with (a field) or through a
    # partial `__init__` keeps: written through it, as the traced layer
    # takes its arguments (the rest is in the partial).
    through = self._field_factory(node, func, children) is not None or (
        isinstance(func, cst.Name) and func.value in self.kept_factories)
    if not through and site not in self.lifts:
      # Written as the traced class: the callee must name that class (not
      # a module class the configuration holds, `self.config.norm`, nor one
      # computed, `getattr(nn, self.kind)`), or the port is right for the
      # traced configuration only.
      named = factories.factory_class(self.callees.target(func))
      if named is not child.cls:
        self.fail(node, f'{self.file.code(func)}(...) makes {child.cls.__name__} in the traced configuration '
                  'only (a module class the configuration holds, or one computed); port it by hand')
    arguments = self._linen_arguments(node, child.cls)
    if spec is not None:
      return self._layer_creation(site, node, spec, arguments, func if through else None)
    if child.cls in self.child_ports:
      return self._module_creation(site, node, arguments)
    if layers.is_flax_class(child.cls):
      self.fail(node, f'Flax\'s {child.cls.__name__} has no NNX counterpart the port knows; port it by hand')
    self.fail(node, f'{child.cls.__name__} could not be ported; see its own entry')

  def _in_size(self, site, node, axis_of, index: int = 0) -> str:
    """The source of the input size of `site`'s modules (of their array input
    `index`): one expression for every execution, or a running variable."""
    node, children = self.sites[site]
    values, sizes = [], []  # (symbolic child, size) of every creation
    for child in children:
      symbolic = self._symbolic_child(child)
      spec = layers.layer_spec(child.cls)
      if not symbolic.calls and spec is not None and spec.in_from_kernel:
        # Called inside a transform only (an RNN's cell): its kernel says.
        kernel = self.symbolic_of(child.parent).variables.get('params', {}).get(child.name, {})
        for key in spec.in_from_kernel:
          kernel = kernel.get(key, {}) if isinstance(kernel, dict) else {}
        if hasattr(kernel, 'shape'):
          value = kernel.shape[0]
          sizes.append((symbolic, value))
          if child.parent is self.instance:
            values.append(value)
          continue
      if not symbolic.calls:
        self.fail(node, f'{child.name} is never called on the traced inputs, so its input size is '
                  'unknown; port it by hand')
      inputs = symbolic.calls[0].args
      if spec is not None and index == 0:
        index = spec.input_index
      if len(inputs) <= index or not hasattr(inputs[index], 'shape'):
        self.fail(node, f'{child.name} is called without an array input; port it by hand')
      value = inputs[index].shape[axis_of(child)]
      sizes.append((symbolic, value))
      if child.parent is self.instance:
        values.append(value)
    first = [c for c in children if c.parent is self.instance]
    # A running size is written from the loop's own sizes: what each
    # creation's size fits over other counts (a block that moves to another
    # stage when a stage is longer) is not asked for then.
    running = self._running_size(node, first, values, uniform=len({str(v) for _, v in sizes}) == 1)
    if running is not None:
      return running
    texts = {self._child_size(symbolic, value) for symbolic, value in sizes}
    if len(texts) == 1:
      return texts.pop()
    by_size: dict[str, list[tracing.Created]] = {}
    for child, (symbolic, value) in zip(children, sizes):
      by_size.setdefault(self._child_size(symbolic, value), []).append(child.parent)
    switched = self._switched_size(node, by_size)
    if switched is not None:
      return switched
    chained = self._chained_size(node, children, sizes)
    if chained is not None:
      return chained
    self.fail(node, f'the input size of {children[0].cls.__name__} changes from one creation to the '
              'next in a way the port cannot write; port it by hand')

  def _chained_size(self, node, children, sizes) -> str | None:
    """`node`'s input size read off the Flax layer made before it (past
    layers that keep it: an activation, a norm), where the instances' sizes
    differ otherwise than by one expression of the fields: big_vision's
    `Dense(self.mlp_dim or 4 * d)` then `Dense(d)` (`self.dense_0.
    out_features`, `mlp_dim` None in some instances), or its `pre_logits`
    made `if self.rep_size:` (a flag or a width) before the head
    (`self.pre_logits.out_features if rep_size else width`). None where
    that is not so."""
    if self._loops(node):
      return None
    by_site: dict = {}  # the site of the layer before (None: none) -> [(instance, size)]
    for child, (symbolic, value) in zip(children, sizes):
      site = self._layer_before(child, symbolic, value)
      by_site.setdefault(site, []).append((child.parent, self._child_size(symbolic, value)))
    if len(by_site) > 2 or None in by_site and len(by_site[None]) and len({t for _, t in by_site[None]}) > 1:
      return None
    around = set(syntax.between(self.file, node, self.method))
    written: list[tuple[str, list, cst.If | None]] = []  # (size, instances, the `if` it needs)
    for site, found in by_site.items():
      texts = {t for _, t in found}
      if len(texts) == 1:
        written.append((texts.pop(), [i for i, _ in found], None))
        continue
      if site not in self.attributes or self.attributes[site][1] or site in self.inlined or self._loops(
          self.sites[site][0]):
        return None
      spec = layers.layer_spec(self.sites[site][1][0].cls)
      conditions = [a for a in syntax.between(self.file, self.sites[site][0], self.method)
                    if isinstance(a, cst.If) and a not in around]
      if len(conditions) > 1 or conditions and self.sites[site][0] not in syntax.descendants(conditions[0].body):
        return None
      written.append((f'self.{self.attributes[site][0]}.{spec.nnx_argument(spec.out_features)}',
                      [i for i, _ in found], conditions[0] if conditions else None))
    if len(written) == 1:
      size, _, condition = written[0]
      return size if condition is None else None
    (first, first_instances, first_if), (second, second_instances, second_if) = written
    if first_if is None:
      (first, first_instances, first_if), (second, second_instances, second_if) = written[::-1]
    if first_if is None or second_if is not None:
      return None
    test = first_if.test
    if self.call_time & source.names_in(test) or not (
        all(switched_sizes.test_value(self.file, test, i) is True for i in first_instances)
        and all(switched_sizes.test_value(self.file, test, i) is False for i in second_instances)):
      return None
    written_test = switched_sizes.init_test(test, self.file, self.field_names)
    return None if written_test is None else f'{first} if {written_test} else {second}'

  def _layer_before(self, child, symbolic, value) -> tracing.Site | None:
    """The site of the Flax layer `child`'s parent made before it (past
    layers that keep their input's size) whose output size is `value`,
    `child`'s input size; None where there is none."""
    order = list(self.symbolic_of(child.parent).root.children)
    index = order.index(symbolic) - 1
    while index >= 0 and (spec := layers.layer_spec(type(order[index].module))) is not None \
            and spec.out_features is None and spec.sequence_field is None:
      index -= 1
    if index < 0:
      return None
    before = order[index]
    made = next((c for c in child.parent.children if c.name == before.name), None)
    spec = layers.layer_spec(type(before.module))
    if made is None or spec is None or spec.out_features is None or str(self._out_size(before)) != str(value):
      return None
    return self.site_of(made)

  def _switched_size(self, node, sizes: dict[str, list[tracing.Created]]) -> str | None:
    """The size an `if` on the configuration before `node` switches
    (`switched_sizes`); None where none does."""
    return switched_sizes.switched_size(self.file, self.method, node, sizes, self.call_time, self.field_names)

  def _running_size(self, node, children, values, uniform: bool) -> str | None:
    """A running variable for the input size, when each layer of a loop
    takes the previous creation's output size (set before the loop and after
    each creation in it), or a layer right after such a loop does: the
    sizes then hold for any number of iterations, where the traced sizes hold
    for the traced number only. None where that is not so."""
    if not children:
      return None
    order = list(self.symbolic.root.children)
    loops = self._loops(node)
    previous_loops = []
    for k, (child, value) in enumerate(zip(children, values)):
      index = order.index(self._symbolic_child(child))
      if index == 0:
        if loops and k == 0:
          continue
        return None
      before = order[index - 1]
      if k == 0:
        # Past layers that keep their input's size (a dropout, a norm after
        # the loop): the loop's running size is theirs too.
        made = index - 1
        while made > 0 and self._keeps_size(order[made]):
          made -= 1
        made_before = next((c for c in self.instance.children if c.name == order[made].name), None)
        if made_before is not None and self.site_of(made_before) in self.sites:
          previous_loops = self._loops(self.sites[self.site_of(made_before)][0])
        # The first layer of the loop starts from what came before it; any
        # other chains from the layer before it in the loop (two streams in
        # one loop do not).
        if loops and not (previous_loops and previous_loops[-1] is loops[-1]):
          continue
      out = self._out_size(before)
      if out is None or str(out) != str(value):
        return None
    if loops:
      loop = loops[-1]
      if id(loop) not in self.running:
        if not all(self._out_source(s) is not None for s in self._sites_in(loop)):
          return None
        if uniform and not any(self._out_source(s) for s in self._sites_in(loop)):
          return None  # every layer of the loop keeps the size: the size itself reads better
        initial = self.size_source(values[0])
        taken = source.names_in(self.method)
        name = next(n for n in (['in_features'] if initial.startswith('__input_') else []) + [
            'in_size', 'size_in', 'running_size'] if n not in taken)
        self.running[id(loop)] = (initial, name)
      return self.running[id(loop)][1]
    if previous_loops and id(previous_loops[-1]) in self.running:
      return self.running[id(previous_loops[-1])][1]
    return None

  def _keeps_size(self, symbolic_child: tracing.Created) -> bool:
    """Whether a Flax layer made outside any loop gives its input's size."""
    spec = layers.layer_spec(type(symbolic_child.module))
    made = next((c for c in self.instance.children if c.name == symbolic_child.name), None)
    return (spec is not None and spec.out_features is None and spec.sequence_field is None and made is not None
            and self.site_of(made) in self.sites and not self._loops(self.sites[self.site_of(made)][0]))

  def _sites_in(self, loop) -> list:
    return [site for site, (n, _) in self.sites.items() if loop in self.file.ancestors(n)]

  def _out_source(self, site) -> str | None:
    """Source of the output size of `site`'s modules: `''` for a layer that
    keeps its input's (a norm, a dropout), None if not known."""
    node, children = self.sites[site]
    child = children[0]
    spec = layers.layer_spec(child.cls)
    if site in self.helpers:
      return '' if spec is not None and spec.out_features is None else None
    arguments = dict(self._linen_arguments(node, child.cls))
    if spec is not None and spec.sequence_field is not None:
      return None  # a Sequential's: its last layer's, not written yet
    if spec is not None:
      if spec.out_features is None:
        return ''
      arg = arguments.get(spec.out_features)
      return None if arg is None else self.file.code(arg.value)
    if child not in [c for c in self.instance.children]:
      return None
    symbolic = self._symbolic_child(child)
    out = self._out_size(symbolic)
    if out is None:
      return None
    for field, arg in arguments.items():
      value = getattr(symbolic.module, field, None)
      if str(value) == str(out):
        return self.file.code(arg.value)
      if isinstance(value, shapes.Unfitted):
        value = value.value  # compared as the traced value, as above
      if not isinstance(value, bool) and (isinstance(value, int) or hasattr(value, 'dimension_as_value')
                                          or type(value).__name__ == '_DimExpr'):
        for m in shapes.WIDENINGS:
          if str(value * m) == str(out):  # a bottleneck's `filters * 4`
            atomic = isinstance(arg.value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.Integer)) or (
                isinstance(arg.value, cst.BinaryOperation)
                and isinstance(arg.value.operator, (cst.Multiply, cst.Power)))
            code = self.file.code(arg.value)
            return f'{code} * {m}' if atomic else f'({code}) * {m}'
    return None

  def _out_size(self, symbolic_child: tracing.Created):
    spec = layers.layer_spec(type(symbolic_child.module))
    if spec is not None and spec.out_features is not None:
      return getattr(symbolic_child.module, spec.out_features)
    outputs = symbolic_child.calls[0].outputs
    return outputs.shape[-1] if hasattr(outputs, 'shape') else None

  def _feature_axis_of(self, node):
    """`child -> the input axis whose size its NNX layer takes`, refusing a
    layer over several axes (`node` names it)."""
    def axis_of(child):
      axis = layers.feature_axis(child.module)
      if axis is None:
        self.fail(node, f'{child.cls.__name__} over several feature axes; port it by hand')
      return axis

    return axis_of

  def _layer_creation(self, site, node, spec: layers.LayerSpec, arguments,
                      through: cst.BaseExpression | None = None) -> cst.BaseExpression:
    nnx_params = spec.nnx_parameters()
    args: list[cst.Arg] = []
    kv_size = None
    if spec.in_features is not None:
      in_size = self._in_size(site, node, self._feature_axis_of(node))
      if spec.in_features_first():
        args.append(cst.Arg(syntax.expression(in_size)))
      if spec.kv_features is not None:
        kv_size = self._kv_size(site, node, spec)
    positional = True
    expected = [p for p in spec.nnx_positional() if p != spec.in_features]
    for i, (field, arg) in enumerate(arguments):
      if field == 'name':
        continue
      if field == '**':  # a choice between two dicts of arguments, NNX's names for Linen's
        args.append(arg.with_changes(value=self._chosen_layer_arguments(node, spec, arg.value)))
        positional = False
        continue
      if field in dict(spec.mode):
        self._mode_argument(arg.value, dict(spec.mode)[field], node)
        positional = False
        continue
      if field == spec.sequence_field:
        args += self._sequence_arguments(site, node, arg)
        positional = False
        continue
      name = spec.nnx_argument(field)
      if name not in nnx_params:
        self.fail(node, f'{spec.nnx} has no argument {name!r} for Linen\'s {field!r}; port it by hand')
      if field in dict(spec.module_fields):
        inner = arg.value
        if inner not in self.node_sites:
          self.fail(node, f'{field}= of {spec.nnx} takes a module created in place; port it by hand')
        self.inlined[self.node_sites[inner]] = (site, (dict(spec.module_fields)[field],))
        arg = arg.with_changes(value=self._creation(self.node_sites[inner]))
        keep_position = positional and arg.keyword is None and i < len(expected) and expected[i] == name
        positional = positional and keep_position
        args.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
                    if keep_position else syntax.keyword(name, arg.value))
        continue
      if self.call_time & source.names_in(arg.value):
        # A size read from the inputs (`x.shape[-1]`) is one NNX knows when it
        # builds: the inputs' sizes are arguments of the constructor. As
        # written where it reads them plainly (`in_features if out_dim is None
        # else out_dim`, big_vision's `mlp_dim or 4 * in_features`: right for
        # every value of `out_dim`), else as traced.
        rewritten = self.without_input_reads(arg.value)
        if rewritten is not None and any(isinstance(n, (cst.IfExp, cst.BooleanOperation))
                                         for n in syntax.descendants(rewritten)):
          # A choice on the configuration the trace took one side of: as written.
          traced = rewritten.with_changes(lpar=[], rpar=[]) if getattr(rewritten, 'lpar', None) else rewritten
        else:
          traced = syntax.expression(self._input_size_argument(site, node, field, arg))
        arg = arg.with_changes(value=traced)
      keep_position = positional and arg.keyword is None and i < len(expected) and expected[i] == name
      if not keep_position:
        positional = False
      args.append(
          arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
          if keep_position else syntax.keyword(name, arg.value)
      )
    if spec.in_features is not None and not spec.in_features_first():
      args.append(syntax.keyword(spec.in_features, syntax.expression(in_size)))
    if kv_size is not None and kv_size != in_size:  # cross-attention: keys of another width
      args.append(syntax.keyword(spec.kv_features, syntax.expression(kv_size)))
    given = {f for f, _ in arguments} | self._given_by_factory(node) | {
        e.key.evaluated_value for f, a in arguments if f == '**' for side in (a.value.body, a.value.orelse)
        for e in side.elements}
    from_field = through is not None and not isinstance(through, cst.Name)
    for field in spec.linen_defaults:
      # (A field's partial may set it: what it holds is the configuration's.)
      if field not in given and not from_field:
        args.append(syntax.keyword(spec.nnx_argument(field), syntax.expression(repr(spec.linen_default(field)))))
    if spec.rngs:
      args.append(syntax.keyword('rngs', cst.Name('rngs')))
    return cst.Call(through if through is not None else syntax.expression(spec.written), syntax.normalised(args))

  def _chosen_layer_arguments(self, node: cst.Call, spec: layers.LayerSpec, choice: cst.IfExp) -> cst.IfExp:
    """`_chosen_arguments`' choice with NNX's names for the layer's Linen
    arguments; refused where a key is not a plain argument of both layers,
    or sets one whose default the port writes (NNX's differs from Linen's)
    on one side only."""
    sides = [{e.key.evaluated_value: e.value for e in side.elements} for side in (choice.body, choice.orelse)]
    for field in set(sides[0]) | set(sides[1]):
      plain = (field not in dict(spec.mode) and field != spec.sequence_field and field not in dict(spec.module_fields)
               and spec.nnx_argument(field) in spec.nnx_parameters())
      if not plain or any(self.call_time & source.names_in(side[field]) for side in sides if field in side):
        self.fail(node, f'{self.file.code(choice)} chooses {field!r}, which {spec.nnx} does not take as a plain '
                  'argument of the configuration (a mode, a module, a size read from the inputs, or no '
                  'counterpart); give it as a keyword, or port it by hand')
      if field in spec.linen_defaults and not all(field in side for side in sides):
        self.fail(node, f'{field!r} is given on one side of {self.file.code(choice)} only, and NNX\'s default '
                  f'for it is not Linen\'s: give it on both sides, or port it by hand')
    body, orelse = (
        cst.Dict([cst.DictElement(cst.SimpleString(repr(spec.nnx_argument(k))), v) for k, v in side.items()])
        for side in sides)
    parens = {} if choice.lpar else {'lpar': [cst.LeftParen()], 'rpar': [cst.RightParen()]}
    return choice.with_changes(body=body, orelse=orelse, **parens)

  def _sequence_arguments(self, site, node, arg: cst.Arg) -> list[cst.Arg]:
    """`nn.Sequential([nn.Dense(8), nn.relu, Block()])`'s list as NNX takes
    it, one argument each: modules created in place (written here, held at
    `layers/<position>`), and functions as NNX spells them."""
    if not isinstance(arg.value, (cst.List, cst.Tuple)) or any(
        isinstance(e, cst.StarredElement) for e in arg.value.elements):
      self.fail(node, f'{self.file.code(arg.value)}: the port writes a Sequential of a list written out '
                '(nn.Sequential([nn.Dense(8), nn.relu])); write it so, or port it by hand')
    args = []
    for position, element in enumerate(arg.value.elements):
      value = element.value
      if value in self.node_sites:
        self.inlined[self.node_sites[value]] = (site, ('layers', position))
        args.append(cst.Arg(self._creation(self.node_sites[value])))
      elif isinstance(value, cst.Call) and self._calls_a_module(value):
        self.fail(value, f'{self.file.code(value)} in a Sequential makes a module the trace did not see '
                  'made there; port it by hand')
      elif local := (source.names_in(value) - syntax.bound_in(value)) & syntax.bound_in(self.method):
        # `d` made before the list, a lambda reading a local of the call:
        # NNX builds the Sequential in `__init__`, where neither is.
        self.fail(value, f'{self.file.code(value)} in a Sequential reads {", ".join(sorted(local))}, a local '
                  'of the method (write each module in the list where it is made, and functions of '
                  'their inputs only); port it by hand')
      else:
        args.append(cst.Arg(value.visit(references.LinenReferences(
            self.file, self.cls, strict=True, bound=syntax.bound_in(self.method)))))
    return args

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

  def _calls_a_module(self, call: cst.Call) -> bool:
    made = helpers.layer_class(self.file, call.func)
    return isinstance(made, type) and issubclass(made, nn.Module)

  def _kv_size(self, site, node, spec: layers.LayerSpec) -> str | None:
    """The size of the key and value inputs where calls give the layer
    them besides the query, positionally as NNX takes them (`attn(x,
    context)`; `attn(x, x)`, self-attention as ViT writes it): for NNX's
    `kv_features` argument. None where no call does."""
    given = False
    for child in self.sites[site][1]:
      for call in child.calls:
        named = [name for name, a in call.kwargs.items() if hasattr(a, 'shape') and name != 'mask']
        if named:
          self.fail(node, f'{spec.nnx} is called with {", ".join(f"{n}=" for n in named)} besides the '
                    'query; pass the keys and values positionally (attn(x, context)), as both Linen '
                    'and NNX take them, or port it by hand')
        arrays = [a for a in call.args[1:] if hasattr(a, 'shape')]
        if len({a.shape[-1] for a in arrays}) > 1:
          self.fail(node, f'{spec.nnx} is called with keys and values of different widths, which NNX '
                    'takes to be one size; port it by hand')
        given = given or bool(arrays)
    return self._in_size(site, node, lambda child: -1, 1) if given else None

  def _input_size_argument(self, site, node, field: str, arg: cst.Arg) -> str:
    """The source of a layer's size argument computed from the call's inputs."""
    texts = set()
    for child in self.sites[site][1]:
      symbolic = self._symbolic_child(child)
      value = getattr(symbolic.module, field)
      if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, 'dimension_as_value') or type(value).__name__ == '_DimExpr'):
        self.fail(
            node,
            f'{field}={self.file.code(arg.value)} depends on the inputs of the call; NNX '
            'builds its layers before any call: port it by hand',
        )
      texts.add(self._child_size(symbolic, value))
    if len(texts) != 1:
      self.fail(node, f'{field}={self.file.code(arg.value)} changes over the loop; port it by hand')
    return texts.pop()

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

  def _made_module(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`self.<attribute>` of the module `value` makes in place or names (a
    local of the method bound to one creation), which the class holds; None
    where it is neither."""
    value = self.creation_named(value) or value
    site = self.node_sites.get(value) if isinstance(value, cst.Call) else None
    if site is None or site not in self.attributes:
      return None
    attribute, is_list = self.attributes[site]
    if is_list:
      self.fail(value, 'a module made in a loop handed to another as an argument; port it by hand')
    return syntax.expression(f'self.{attribute}')

  def _module_creation(self, site, node, arguments) -> cst.BaseExpression:
    _, children = self.sites[site]
    port = self.child_ports[children[0].cls]
    # Fields the child's port takes as its mode leave the creation (NNX's
    # model.train() / .eval() reach every submodule); the rest keep their
    # order, as the port's constructor keeps the fields'.
    args = []
    handed = set(self.handed.values())
    from_inputs = set()  # the arguments computed from the inputs' sizes, as `__init__` has them
    for field, arg in arguments:
      if field == '**':
        if port.field_modes:
          self.fail(node, f'{self.file.code(arg.value)} hands {port.cls.__name__} its fields by name, and the '
                    f'NNX mode replaces its {", ".join(port.field_modes)}; port it by hand')
        args.append(arg)
      elif field in port.field_modes:
        self._mode_argument(arg.value, not port.field_modes[field], node)
      elif arg.value in handed:
        args.append(arg.with_changes(value=self._nnx_handed(arg.value)))  # `nn.Dense` -> `nnx.Linear`
      elif (made := self._made_module(arg.value)) is not None:
        args.append(arg.with_changes(value=made))  # `emb=nn.Embed(11, 4)`, `emb=emb`: the NNX module
      elif field != 'name' and self.call_time & source.names_in(arg.value):
        # `FinalLayer(patch, out_channels)` with `out_channels = x.shape[-1]
        # * 2`: the inputs' sizes it reads are the constructor's.
        rewritten = self.without_input_reads(arg.value)
        if rewritten is not None:
          from_inputs.add(field)
          if getattr(rewritten, 'lpar', None):
            rewritten = rewritten.with_changes(lpar=[], rpar=[])
          args.append(arg.with_changes(value=rewritten))
        else:
          args.append(arg)
      elif field != 'name':
        args.append(arg)
    # A flag inside a field the child takes (`config.deterministic`): the
    # mode of this class too, through the field it hands on.
    given = dict(arguments)
    for mode, train_value in port.field_modes.items():
      field, _, rest = mode.partition('.')
      if not rest:
        continue
      path = self.field_path(given[field].value) if field in given else None
      if path is None:
        self.fail(node, f'{children[0].cls.__name__} takes its mode from {mode}, which this class '
                  'does not hand it from its own configuration; port it by hand')
      if self.field_modes.setdefault(f'{path}.{rest}', train_value) != train_value:
        self.fail(node, f'{path}.{rest} sets modes both ways; port it by hand')
    for field, arg in arguments:
      if field != 'name' and field not in port.field_modes and arg.value not in handed and (
          field not in from_inputs) and (self.call_time & source.names_in(arg.value)):
        self.fail(
            node,
            f'{field}={self.file.code(arg.value)} depends on the inputs of the call; port it by hand',
        )
    for parameter in port.inputs:
      if not parameter.whole_shape:
        size = self._in_size(site, node, lambda child: -1, parameter.index)
        args.append(syntax.keyword(parameter.name, syntax.expression(size)))
        continue
      texts: dict[str, list[tracing.Created]] = {}  # the shape -> the instances that give it
      for child in children:
        symbolic = self._symbolic_child(child)
        shape = symbolic.calls[0].args[parameter.index].shape
        shape = shape if parameter.with_batch else shape[1:]
        text = syntax.tuple_source(self._child_size(symbolic, d) for d in shape)
        texts.setdefault(text, []).append(child.parent)
      text = next(iter(texts)) if len(texts) == 1 else self._switched_size(node, texts)
      if text is None:
        self.fail(node, f'the input sizes of {port.cls.__name__} change over the loop; port it by hand')
      args.append(syntax.keyword(parameter.name, syntax.expression(text)))
    args.append(syntax.keyword('rngs', cst.Name('rngs')))
    func = self.lifts[site][0].target if site in self.lifts else self.expanded(node).func
    if isinstance(func, cst.Attribute) and helpers.layer_class(self.file, func) is port.cls:
      func = cst.Name(port.cls.__name__)  # `layers.Block(...)`: the port written beside this one
    return cst.Call(func, syntax.normalised(args))

  def _assemble(self, init_body, methods: dict) -> ClassPort:
    """The NNX class: `__init__` from `init_body` where the creating method
    was, then the class's other statements, `methods` rewritten."""
    inputs = self._input_parameters()
    fields = [
        f for f in declared_fields(self.cdef, self.cls, self.file, self.field_names)
        if f.target.value not in self.field_modes  # a flag inside a field leaves the field
    ]
    init = self._init_method(fields, inputs, init_body)
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
    if self.merged_flags:
      node = node.visit(_FirstFrom(self.merged_flags))
    node = node.visit(references.LinenReferences(self.file, self.cls, strict=False))
    node = _without_dead_fields(
        node, [n for n in self.field_names if n not in self.field_modes and n not in self._read_elsewhere()])
    self._check_mode_fields_gone(node, init)
    return ClassPort(self.cls, node, self.attributes, inputs, self.modes, self.params, self,
                     dict(self.field_modes),
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

  def _check_mode_fields_gone(self, node: cst.ClassDef, init: cst.FunctionDef) -> None:
    """A field taken as the mode is read nowhere else: NNX's mode replaces it.
    Nor do modes come both from the call and from the configuration: NNX has
    one mode, Linen then has states NNX cannot take."""
    if self.field_modes and self.modes:
      self.fail(self.cdef, f'the layers\' modes come from the call ({", ".join(self.modes)}) and from '
                f'the configuration ({", ".join(self.field_modes)}); NNX has one mode: port it by hand')
    flags = self.modes or self.field_modes
    if len(flags) > 1:
      # `train` for dropout beside `update_stats` for batch statistics: frozen
      # statistics while fine-tuning is a state `model.train()` cannot give.
      self.fail(self.cdef, f'the layers\' modes come from {len(flags)} flags ({", ".join(sorted(flags))}), '
                'which Linen sets apart and NNX\'s one mode (`model.train()` / `.eval()`) would '
                'set together: port it by hand, each layer\'s `deterministic` / '
                '`use_running_average` set on its own')
    if not self.field_modes:
      return
    left = set()

    class Reads(cst.CSTVisitor):
      def visit_Attribute(self, n):
        if isinstance(n.value, cst.Name) and n.value.value == 'self':
          left.add(n.attr.value)

    node.visit(Reads())
    left |= source.names_in(init.body)
    for field in self.field_modes:
      if '.' not in field and field in left:
        self.fail(self.cdef, f'the field {field!r} sets the layers\' modes and does more (NNX sets '
                  'modes with model.train() / .eval()); port it by hand')
    dotted = {f for f in self.field_modes if '.' in f}
    writer = self

    class DottedReads(cst.CSTVisitor):
      def visit_Attribute(self, n):
        if n not in writer._mode_reads and writer.field_path(n) in dotted:
          writer.fail(n, f'{writer.field_path(n)} sets the layers\' modes and does more (NNX sets '
                      'modes with model.train() / .eval()); port it by hand')

    if dotted:
      self.cdef.visit(DottedReads())

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
      if self._loops(call):
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
      if self._loops(call):
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

  def _input_parameters(self) -> list[InputParameter]:
    by_index: dict[int, set[shapes.InputDim]] = {}
    for dim in self.used_dims:
      by_index.setdefault(dim.index, set()).add(dim)
    if len(by_index) == 1:
      ((index, dims),) = by_index.items()
      # (The same axis, traced at several sizes: the blocks of a ResNet with
      # and without their shortcut are traced apart.)
      axes = {(d.dim, d.ndim) for d in dims}
      if len(axes) == 1 and next(iter(dims)).dim == next(iter(dims)).ndim - 1:
        return [InputParameter('in_features', index, next(iter(dims)).ndim, False)]
    parameters = []
    for index, dims in sorted(by_index.items()):
      with_batch = any(d.dim == 0 for d in dims)
      name = f'{next(iter(dims)).name}_shape' + ('_with_batch' if with_batch else '')
      parameters.append(InputParameter(name, index, next(iter(dims)).ndim, True, with_batch))
    return parameters

  def _field_default(self, field: cst.AnnAssign):
    """A field's default: `x: int = 3` -> `3`; `dataclasses.field(default=3)`
    -> `3`; a `default_factory` is refused. A module class the field makes
    modules with (`conv: ModuleDef = nn.Conv`) is NNX's (`nnx.Conv`)."""
    value = field.value
    if isinstance(value, cst.Call) and (references.dotted(value.func) or [''])[-1] == 'field':
      keywords = {a.keyword.value: a.value for a in value.args if a.keyword is not None}
      if 'default' in keywords:
        value = keywords['default']
      elif 'default_factory' in keywords:
        self.fail(field, f'{self.file.code(field.target)} has a default_factory; port it by hand')
      else:
        return None
    name = field.target.value
    default = next((f.default for f in dataclasses.fields(self.cls) if f.name == name), None)
    if isinstance(default, functools.partial) and factories.factory_class(default) is not None:
      # (Its settings would have to be NNX's: written by hand.)
      self.fail(field, f'the default of {name!r}, {self.file.code(value)}, is a partial of a module class; '
                'port it by hand')
    cls = factories.factory_class(helpers.layer_class(self.file, value)) if value is not None else None
    if cls is None:
      return value
    made = self.factory_fields.get(name)
    spec = layers.layer_spec(cls)
    if made is not None and (spec or cls) is not made:
      self.fail(field, f'the default of {name!r}, {self.file.code(value)}, takes other arguments than the '
                f'{_made_name(made)} the traced configuration makes with it; port it by hand')
    if spec is not None:
      return syntax.expression(spec.written)
    if cls in self.child_ports and isinstance(value, cst.Name) and value.value == cls.__name__:
      return value  # the port's class of the same name
    self.fail(field, f'the default of {name!r}, {self.file.code(value)}, is a module class the port does '
              'not write; port it by hand')

  def _init_method(self, fields, inputs, body) -> cst.FunctionDef:
    params = [cst.Param(cst.Name('self'))]
    taken = set(self.file.names)
    # (A default reading the class's own names, `constant(SCALE)`, is left in place.)
    class_names = {n for statement in self.cdef.body.body for n in syntax.bound_names(statement)}
    for field in fields:
      default = self._field_default(field)
      if default is not None and syntax.has_call(default) and not source.names_in(default) & class_names:
        # A default Linen computes once, with the class (`normal(stddev=0.1)`),
        # NNX reads from a module constant, as Flax's layers do (ruff's B008).
        name = f'default_{field.target.value}'
        while name in taken:
          name += '_'
        taken.add(name)
        self.constants.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], default)]))
        default = cst.Name(name)
      params.append(cst.Param(
          field.target, annotation=_optional_if_none(field.annotation, default),
          default=default, equal=cst.AssignEqual() if default is not None else cst.MaybeSentinel.DEFAULT,
      ))
    kwonly = [
        cst.Param(
            cst.Name(p.name),
            annotation=cst.Annotation(syntax.expression('tuple[int, ...]' if p.whole_shape else 'int')),
        )
        for p in inputs
    ] + [
        cst.Param(cst.Name(name), annotation=cst.Annotation(syntax.expression('jnp.dtype')),
                  default=syntax.expression(f'jnp.{dtype}'), equal=cst.AssignEqual())
        for name, dtype in self.dtype_parameters.items()
    ] + [cst.Param(cst.Name('rngs'), annotation=cst.Annotation(syntax.expression('nnx.Rngs')))]
    # In `__init__` a field is its argument: `self.features` reads `features`,
    # but for a field a local of `__init__` takes the name of (`conv =
    # partial(self.conv, use_bias=False)`, as Linen's ResNet writes it).
    bound: set[str] = set()

    class Bound(cst.CSTVisitor):
      def visit_AssignTarget(self, node):
        bound.update(syntax.target_names(node.target))

    for statement in body:
      statement.visit(Bound())
    fields_read = set(self.field_names) - bound

    class Arguments(cst.CSTTransformer):
      def leave_Attribute(self, original, updated):
        if (isinstance(updated.value, cst.Name) and updated.value.value == 'self'
            and updated.attr.value in fields_read):
          return cst.Name(updated.attr.value)
        return updated

    body = [s.visit(Arguments()) for s in body]
    for n in self.field_names:
      if n in NNX_MODE_ATTRIBUTES and n not in self.field_modes and n not in self.merged_flags:
        self.fail(self.cdef, f'the field {n!r} is not a layer mode in this class, but NNX\'s model.train() / '
                  f'.eval() set every attribute named {n!r}, which would change it: rename it, or port it by hand')
    statements = [
        syntax.statement(f'self.{n} = {n}\n') for n in self.field_names if n not in self.field_modes
    ]
    if self.draws:
      # `self.make_rng(stream)` draws from the Rngs the model is built with,
      # shared, in the order the model draws (Linen splits keys by path).
      statements.append(syntax.statement('self.rngs = rngs\n'))
    statements += body
    return cst.FunctionDef(
        name=cst.Name('__init__'),
        params=cst.Parameters(params=params, star_arg=cst.ParamStar(), kwonly_params=kwonly),
        body=cst.IndentedBlock(statements),
        leading_lines=self.method.leading_lines,
    )

  def _without_mode_arguments(self, original: cst.Call, updated: cst.Call, child) -> cst.Call:
    """A call of a created module without the arguments that set what the
    NNX mode sets (`deterministic=not train` of a Dropout, `train` of a
    user module whose port took it as its mode)."""
    spec = layers.layer_spec(child.cls)
    if spec is not None:
      modes = dict(spec.mode)
      parameters = list(inspect.signature(child.cls.__call__).parameters)[1:]
    else:
      port = self.child_ports.get(child.cls)
      modes = {} if port is None else {k: not v for k, v in port.modes.items()}
      parameters = [] if port is None else port.call_parameters
    if not modes:
      return updated
    kept = []
    for i, arg in enumerate(updated.args):
      name = arg.keyword.value if arg.keyword else (parameters[i] if i < len(parameters) else None)
      if name in modes and self._reads_merged_flag(original.args[i].value):
        kept.append(arg)  # the flag stays an argument: NNX's layers take it at the call too
        continue
      if name in modes:
        self._mode_argument(original.args[i].value, modes[name], original)
        continue
      kept.append(arg)
    return updated.with_changes(args=syntax.normalised(kept))

  def _merged_flags(self) -> set[str]:
    """The fields named as NNX's modes that the class's methods merge with
    their argument of the same name, and read nowhere else: `deterministic =
    nn.module.merge_param('deterministic', self.deterministic, deterministic)`.
    Such a class is written as NNX's own layers are: the field an attribute
    that `model.train()` / `.eval()` set, the argument kept, the argument
    first (`first_from`), so a model in eval mode still runs as its call says."""
    merges, reads = {}, {}

    class Visitor(cst.CSTVisitor):
      def visit_Call(self, node):
        name = _merged_name(node)
        if name is not None:
          merges[name] = merges.get(name, 0) + 1

      def visit_Attribute(self, node):
        if isinstance(node.value, cst.Name) and node.value.value == 'self':
          reads[node.attr.value] = reads.get(node.attr.value, 0) + 1

    self.cdef.visit(Visitor())
    return {n for n, count in merges.items()
            if n in NNX_MODE_ATTRIBUTES and n in self.field_names and reads.get(n) == count}

  def _reads_merged_flag(self, value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value in self.merged_flags

  def _creates(self, value: cst.CSTNode) -> bool:
    """Whether `value` holds a creation (`nn.BatchNorm(use_running_average=
    not train)(y)`): the flag it reads sets that layer's mode, which the
    NNX mode sets."""
    finder = syntax.CallsAmong({node: site for site, (node, _) in self.sites.items()})
    value.visit(finder)
    return bool(finder.found) or any(  # `block(x, deterministic)`, `block = Block(...)`
        isinstance(n, cst.Call) and self.creation_named(n.func) is not None for n in syntax.descendants(value))

  def creation_named(self, node: cst.BaseExpression) -> cst.Call | None:
    """The creation a local of the method names, bound to it once (`block`
    of `block = Block(...)`); None for anything else."""
    bound = self.method_locals.get(node.value) if isinstance(node, cst.Name) else None
    return bound if bound is not None and bound in self.node_sites else None

  def _drop_flag(self, method: cst.FunctionDef, flag: str) -> cst.FunctionDef:
    aliases = {name for name, value in self.locals.items()
               if value is not None and flag in source.names_in(value) and not self._creates(value)}

    class Drop(cst.CSTTransformer):
      def leave_SimpleStatementLine(self, original, updated):
        if all(isinstance(s, cst.Assign) for s in updated.body):
          targets = {n for s in updated.body for t in s.targets for n in syntax.target_names(t.target)}
          if targets and targets <= aliases:
            return cst.RemoveFromParent()
        return updated

    method = method.visit(Drop())
    params = syntax.params_normalised([p for p in method.params.params if p.name.value != flag])
    kwonly = syntax.params_normalised([p for p in method.params.kwonly_params if p.name.value != flag])
    star = method.params.star_arg
    if not kwonly and isinstance(star, cst.ParamStar):
      star = cst.MaybeSentinel.DEFAULT  # `*` with nothing after it left
    method = method.with_changes(
        params=method.params.with_changes(params=params, kwonly_params=kwonly, star_arg=star)
    )
    if flag in source.names_in(method.body) or aliases & source.names_in(method.body):
      self.fail(
          self.method,
          f'{flag!r} does more than set the layers\' modes (NNX sets them with model.train() / '
          '.eval()); port it by hand',
      )
    return method


class _FirstFrom(cst.CSTTransformer):
  """Each merge of a flag in `names` as NNX merges it (`first_from`)."""

  def __init__(self, names: set[str]):
    self.names = names

  def leave_Call(self, original, updated):
    return first_from(updated) if _merged_name(original) in self.names else updated


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


def _merged_name(node: cst.CSTNode) -> str | None:
  """`'deterministic'` of `nn.module.merge_param('deterministic',
  self.deterministic, deterministic)`, else None."""
  if not (isinstance(node, cst.Call) and (references.dotted(node.func) or [])[-2:] == ['module', 'merge_param']
          and len(node.args) == 3 and all(a.keyword is None and not a.star for a in node.args)
          and isinstance(node.args[0].value, cst.SimpleString)):
    return None
  name = node.args[0].value.evaluated_value
  if (references.dotted(node.args[1].value) == ['self', name]
      and isinstance(node.args[2].value, cst.Name) and node.args[2].value.value == name):
    return name
  return None


def first_from(node: cst.Call) -> cst.Call:
  """`nn.module.merge_param('deterministic', self.deterministic, deterministic)`
  as NNX's layers merge their modes: the argument, else the attribute
  (`first_from(deterministic, self.deterministic, error_msg=...)`). Linen
  refuses both given; NNX's `model.eval()` sets the attribute of every
  module, so there the argument must win (where Linen would run, both agree)."""
  name = node.args[0].value.evaluated_value
  return syntax.expression(
      f"first_from({name}, self.{name}, error_msg='{name}: not given, nor set by model.eval()')")


#: The attributes NNX's `model.train()` / `.eval()` set on every module.
NNX_MODE_ATTRIBUTES = ('deterministic', 'use_running_average')


def _optional_if_none(annotation: cst.Annotation, default) -> cst.Annotation:
  """A field's annotation as a parameter's: `X | None` where its default is
  None and `X` does not say so (a dataclass field may; a parameter, PEP 484
  says, may not)."""
  if not (isinstance(default, cst.Name) and default.value == 'None'):
    return annotation
  code = cst.Module([]).code_for_node(annotation.annotation)
  if code in ('None', 'Any', 'typing.Any', 'object') or code.startswith(('Optional[', 'typing.Optional[')) or (
      'None' in {n.strip() for n in code.split('|')}):
    return annotation
  inner = annotation.annotation
  if isinstance(inner, cst.BinaryOperation) or isinstance(inner, cst.SimpleString):
    return annotation  # `a | b`, or a string: left as written
  return annotation.with_changes(annotation=cst.BinaryOperation(inner, cst.BitOr(), cst.Name('None')))


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


def _made_name(made) -> str:
  """The name of what a factory field makes: a Flax layer's spec or a class."""
  return made.linen.__name__ if isinstance(made, layers.LayerSpec) else made.__name__



def _keyword_dict(node: cst.BaseExpression) -> list[cst.Arg] | None:
  """`dict(kernel_init=...)` or `{'kernel_init': ...}` (string keys that
  are names) as keyword arguments; else None."""
  if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == 'dict' and all(
      a.keyword is not None and not a.star for a in node.args):
    return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in node.args]
  if isinstance(node, cst.Dict) and all(
      isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
      and e.key.evaluated_value.isidentifier() for e in node.elements):
    return [syntax.keyword(e.key.evaluated_value, e.value) for e in node.elements]
  return None

def _value_at(module, path: str):
  value = module
  for name in path.split('.'):
    value = getattr(value, name, None)
  return value


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


