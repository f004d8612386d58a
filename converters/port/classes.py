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

The writer reads the class through parts of its own: where the creations
are (`creation_sites`), what it refuses (`refusals`), Linen's API it calls
on itself (`linen_api`), its own variables (`own_variables`), and it
assembles the NNX class (`assembly`).
"""


from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import libcst as cst

from converters.port import (
  assembly,
  branches,
  constructor,
  creation_arguments,
  creation_sites,
  creations,
  factories,
  helpers,
  input_sizes,
  layers,
  lifted_classes,
  linen_api,
  mode_flags,
  own_variables,
  partials,
  placement,
  references,
  refusals,
  shapes,
  shared_scopes,
  source,
  syntax,
  tracing,
  variables,
)
from converters.port.errors import Untranslatable


@dataclasses.dataclass
class ClassPort:
  """What was written for one Linen class: plain data, read without its
  writer.

  Attributes:
    cls: the Linen class.
    node: the NNX class statement.
    placement: where the modules the class creates are in the port
      (`converters.port.placement`).
    constructor: what its `__init__` takes (`constructor.ConstructorPlan`).
    modes: `__call__` arguments that became the module's mode -> their value
      in training.
    call_parameters: `__call__`'s parameters (positional, then keyword-only).
    file: the Linen source the class was read from.
    field_modes: fields that became the module's mode (`deterministic` of a
      block that only hands it to its dropouts) -> their value in training;
      the NNX constructor does not take them.
    helpers: the file's functions that make layers, as the port writes
      them (`converters.port.helpers`), by name.
    has_cache: whether the port has `init_cache` (its layers, or it, hold
      a decode cache).
    constants: module statements written before the class (`default_init
      = ...`).
    sown: Linen collections other than `intermediates` the class sows into
      -> the `nnx.Intermediate` subclass the file defines for each.
    untraced_branches: the blocks of an `if` no traced instance takes,
      written to raise (`branches.UntracedBranch`).
    ties: the input sizes the code ties to a field (`x - y`, y of `channels`
      features): the input's dimension -> the field's value it takes
      (`shapes.SymbolicTrace.ties` of the traced instance).
  """

  cls: type
  node: cst.ClassDef
  placement: placement.Placement
  constructor: constructor.ConstructorPlan
  modes: dict[str, bool]
  call_parameters: list[str]
  file: source.SourceFile
  field_modes: dict[str, bool] = dataclasses.field(default_factory=dict)
  helpers: dict[str, cst.FunctionDef] = dataclasses.field(default_factory=dict)
  has_cache: bool = False
  constants: list[cst.SimpleStatementLine] = dataclasses.field(default_factory=list)
  sown: dict[str, str] = dataclasses.field(default_factory=dict)
  untraced_branches: tuple[branches.UntracedBranch, ...] = ()
  ties: dict[shapes.InputDim, shapes.FieldValue] = dataclasses.field(default_factory=dict)

  @property
  def inputs(self) -> tuple[constructor.InputParameter, ...]:
    """The constructor's parameters made of input sizes."""
    return self.constructor.inputs


class ClassWriter:
  """Writes one class: see the module docstring. Subclasses say where the
  creations are (`_methods`, `loops_around`, `_attributes`) and write the
  class (`write`); where the port holds them is the `placement.Placement`
  the written `ClassPort` carries."""

  #: Whether the writer writes `self.has_variable('cache', ...)` (a cache
  #: NNX makes where it builds the module: always there).
  writes_has_cache = False
  #: Whether the writer writes `self.make_rng(stream)` (a draw from the
  #: `nnx.Rngs` the module keeps: `self.rngs.<stream>()`).
  writes_draws = False
  #: Whether the writer writes `__call__` decorated with Linen's scan over
  #: its inputs (`functools.partial(nn.scan, variable_broadcast='params',
  #: ...)`) as `nnx.scan` over the method, and with `nn.remat` as `nnx.remat`.
  writes_lifted_call = False
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
    refusals.refuse_calls_unseen(self)
    self.symbolic = self.symbolic_of(instance)
    self.sizes = input_sizes.InputSizes(self)
    # `method` creates the submodules, `call` is `__call__`: the compact
    # method both, or `setup` and `__call__`.
    self.method, self.call = self._methods()
    self.creation_sites = placement.CreationSites.of(self.file, self.method)
    #: Whether `__call__` is Linen's scan over its inputs (`nnx.scan` in NNX).
    self.scans_call = any(lifted_classes.is_method_scan(d, self.file) for d in self.call.decorators)
    refusals.refuse_lifted_methods(self)
    self.field_names = shapes.module_fields(instance.module)
    self.params = [p.name.value for p in (*self.call.params.params[1:], *self.call.params.kwonly_params)]
    self.call_time = self._call_time()
    self.locals = syntax.assigned_once(self.call.body)
    self.mode_flags = mode_flags.ModeFlags(self)
    refusals.refuse_merged_flags_off(self)
    #: Linen collections other than `intermediates` the class sows into ->
    #: the `nnx.Intermediate` subclass the file defines for each.
    self.sown: dict[str, str] = {}
    #: The streams `self.make_rng` draws from (`linen_api`).
    self.draws: set[str] = linen_api.drawn_streams(self)
    refusals.refuse_linen_modules_held(self)
    refusals.refuse_linen_decorators(self)
    # The locals the creating method binds once (`norm = partial(...)`).
    self.method_locals = self.locals if self.method is self.call else syntax.assigned_once(self.method.body)
    self.arguments = creation_arguments.CreationArguments(self)
    #: Linen variable name -> the NNX attribute holding it, where they differ
    #: (`self.table = self.param('embedding', ...)` in `setup()`).
    self.variable_attributes: dict[str, str] = {}
    self.sites, self.helpers = creation_sites.read(self)
    self.handed_calls = own_variables.handed_calls(self)
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
        self.method, self.file, self.sites, self.exclusive, self.fail) if self.writes_shared_scopes else {}
    refusals.refuse_linen_names_left(self)
    #: A list's site -> `(prefix, first number)` of its modules' Linen names,
    #: where the list's index is read off them (`setup()`'s `layers_2`).
    self.numbering: dict[tracing.Site, tuple[str, int]] = {}
    self.attributes = self._attributes()
    #: Keywords of the constructor for dtypes Linen reads off the call
    #: (`inputs.dtype`): name -> its default, the traced dtype's name.
    self.dtype_parameters: dict[str, str] = {}
    # Sites of modules created as another creation's argument (an RNN's
    # cell): site -> (the creation's site, the NNX attribute holding it).
    self.inlined: dict = {}
    self.creations = creations.Creations(self)

  def fail(self, node: cst.CSTNode | None, message: str):
    line = self.file.line_of(node) if node is not None else self.file.line_of(self.cdef)
    raise Untranslatable(self.cls, line, message)

  # --- what is created where

  def site_of(self, child: tracing.Created) -> tracing.Site | None:
    """Where the method creates `child` (`placement.CreationSites.site_of`)."""
    return self.creation_sites.site_of(child)

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

  def exclusive(self, node, others) -> bool:
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
    was, then the class's other statements, `methods` rewritten
    (`converters.port.assembly`)."""
    init_writer = constructor.Constructor(self)
    inputs = init_writer.input_parameters()
    fields = [
        f for f in constructor.declared_fields(self.cdef, self.cls, self.file, self.field_names)
        if f.target.value not in self.mode_flags.fields  # a flag inside a field leaves the field
    ]
    plan = init_writer.plan(fields, inputs)
    init = constructor.write_init(plan, init_body, self.method.leading_lines)
    init, init_cache = assembly.finished_init(self, init, inputs)
    node = assembly.class_def(self, init, init_cache, methods)
    self.mode_flags.check_fields_gone(node, init)
    constants = [syntax.statement(f'{c.name} = {c.value}\n').visit(
        references.LinenReferences(self.file, self.cls, strict=False)) for c in plan.constants]
    return ClassPort(
        self.cls, node, self.written_placement(), plan, self.mode_flags.call, self.params, self.file,
        field_modes=dict(self.mode_flags.fields), helpers=assembly.helper_functions(self),
        has_cache=init_cache is not None, constants=constants, sown=dict(self.sown),
        untraced_branches=tuple(self.untraced_branches.values()), ties=dict(self.symbolic.ties))

  def written_placement(self) -> placement.Placement:
    """Where the port holds the modules the class creates, as written."""
    held = {site: placement.Held(attribute, in_list, self.numbering.get(site))
            for site, (attribute, in_list) in self.attributes.items() if site not in self.inlined}
    inside = {site: placement.Inside(outer, path) for site, (outer, path) in self.inlined.items()}
    return placement.Placement(self.creation_sites, held, inside, dict(self.variable_attributes))

  def _own_variables(self) -> dict[cst.Call, variables.OwnVariable]:
    """`self.param(...)` / `self.variable(...)` calls of the method, written;
    the parameters the handed calls make set as `handed_variables`
    (`converters.port.own_variables`)."""
    own, self.handed_variables = own_variables.own_variables(self)
    return own

  def creation_named(self, node: cst.BaseExpression) -> cst.Call | None:
    """The creation a local of the method names, bound to it once (`block`
    of `block = Block(...)`); None for anything else."""
    bound = self.method_locals.get(node.value) if isinstance(node, cst.Name) else None
    return bound if bound is not None and bound in self.node_sites else None



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
      and syntax.self_attribute(small.value) == small.targets[0].target.value
  )
