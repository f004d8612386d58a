"""A port's `__init__`, in two passes: what it takes (`ConstructorPlan`,
plain data: the class's fields with their defaults, the sizes it reads off
the inputs, the dtypes Linen read off the call, `rngs`; the module
constants its defaults need), decided from the class by `Constructor.plan`;
then the method written from that plan and the creations' statements
(`write_init`), a function of them alone.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import libcst as cst

from converters.port import (
  factories,
  helpers,
  layers,
  mode_flags,
  partials,
  references,
  shapes,
  source,
  syntax,
)
from converters.port.errors import Untranslatable

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


@dataclasses.dataclass(frozen=True)
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


class ParameterKind(enum.Enum):
  """What a parameter of the port's constructor stands for."""

  FIELD = 'a field of the Linen class'  # positional, with the field's default
  INPUT = 'sizes of an input'  # Linen read them off the call (`InputParameter`)
  DTYPE = 'the dtype of a value of the call'  # Linen made variables in it
  RNGS = 'the random streams'


@dataclasses.dataclass(frozen=True)
class ConstructorParameter:
  """One parameter of `__init__`: its annotation and default as source."""

  name: str
  kind: ParameterKind
  annotation: str | None = None
  default: str | None = None


@dataclasses.dataclass(frozen=True)
class ModuleConstant:
  """`name = value` before the class: a default Linen computes once, with
  the class (`normal(stddev=0.1)`), as Flax's layers read theirs."""

  name: str
  value: str


@dataclasses.dataclass(frozen=True)
class ConstructorPlan:
  """What the port's `__init__` takes and binds.

  Attributes:
    parameters: in order: the fields (positional), then the input sizes,
      the dtypes and `rngs` (keyword-only).
    inputs: the input-size parameters, as the creations read them.
    constants: module statements the fields' defaults read.
    fields: every field of the Linen class: `self.<field>` in the
      creations reads the argument of that name, unless they rebind it.
    stored: the fields kept as attributes (`self.<field> = <field>`).
    keeps_rngs: whether the port keeps `rngs` (`self.rngs = rngs`), to draw
      from at its call.
  """

  parameters: tuple[ConstructorParameter, ...]
  inputs: tuple[InputParameter, ...] = ()
  constants: tuple[ModuleConstant, ...] = ()
  fields: tuple[str, ...] = ()
  stored: tuple[str, ...] = ()
  keeps_rngs: bool = False

  def of_kind(self, kind: ParameterKind) -> tuple[ConstructorParameter, ...]:
    return tuple(p for p in self.parameters if p.kind is kind)


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


class Constructor:
  """The `__init__` of one class's port, for its `ClassWriter`."""

  def __init__(self, writer: ClassWriter):
    self.writer = writer
    self.file, self.fail, self.cdef = writer.file, writer.fail, writer.cdef

  def input_parameters(self) -> list[InputParameter]:
    """The parameters made of input sizes, from the inputs' dimensions
    the sizes read (`InputSizes.used_dims`)."""
    by_index: dict[int, set[shapes.InputDim]] = {}
    for dim in self.writer.sizes.used_dims:
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
    default = next((f.default for f in dataclasses.fields(self.writer.cls) if f.name == name), None)
    if isinstance(default, functools.partial) and factories.factory_class(default) is not None:
      # (Its settings would have to be NNX's: written by hand.)
      self.fail(field, f'the default of {name!r}, {self.file.code(value)}, is a partial of a module class; '
                'port it by hand')
    cls = factories.factory_class(helpers.layer_class(self.file, value)) if value is not None else None
    if cls is None:
      return value
    made = self.writer.partials.fields.get(name)
    spec = layers.layer_spec(cls)
    if made is not None and (spec or cls) is not made:
      self.fail(field, f'the default of {name!r}, {self.file.code(value)}, takes other arguments than the '
                f'{partials.made_name(made)} the traced configuration makes with it; port it by hand')
    if spec is not None:
      return syntax.expression(spec.written)
    if cls in self.writer.child_ports and isinstance(value, cst.Name) and value.value == cls.__name__:
      return value  # the port's class of the same name
    self.fail(field, f'the default of {name!r}, {self.file.code(value)}, is a module class the port does '
              'not write; port it by hand')

  def plan(self, fields: Sequence[cst.AnnAssign], inputs: Sequence[InputParameter]) -> ConstructorPlan:
    """What `__init__` takes, for `fields` (the declared fields it keeps
    as parameters) and `inputs`; refuses a field NNX's mode would set."""
    for n in self.writer.field_names:
      if n in mode_flags.NNX_MODE_ATTRIBUTES and n not in self.writer.mode_flags.fields and n not in self.writer.mode_flags.merged:
        self.fail(self.cdef, f'the field {n!r} is not a layer mode in this class, but NNX\'s model.train() / '
                  f'.eval() set every attribute named {n!r}, which would change it: rename it, or port it by hand')
    taken = set(self.file.names)
    # (A default reading the class's own names, `constant(SCALE)`, is left in place.)
    class_names = {n for statement in self.cdef.body.body for n in syntax.bound_names(statement)}
    parameters, constants = [], []
    for field in fields:
      default = self._field_default(field)
      if default is not None and syntax.calls_in(default) and not syntax.names_in(default) & class_names:
        # A default Linen computes once, with the class (`normal(stddev=0.1)`),
        # NNX reads from a module constant, as Flax's layers do (ruff's B008).
        name = f'default_{field.target.value}'
        while name in taken:
          name += '_'
        taken.add(name)
        constants.append(ModuleConstant(name, syntax.code_of(default)))
        default = cst.Name(name)
      parameters.append(ConstructorParameter(
          field.target.value, ParameterKind.FIELD, syntax.code_of(optional_if_none(field.annotation, default).annotation),
          syntax.code_of(default) if default is not None else None))
    parameters += [
        ConstructorParameter(p.name, ParameterKind.INPUT, 'tuple[int, ...]' if p.whole_shape else 'int')
        for p in inputs
    ]
    parameters += [
        ConstructorParameter(name, ParameterKind.DTYPE, 'jnp.dtype', f'jnp.{dtype}')
        for name, dtype in self.writer.dtype_parameters.items()
    ]
    parameters.append(ConstructorParameter('rngs', ParameterKind.RNGS, 'nnx.Rngs'))
    return ConstructorPlan(
        tuple(parameters), tuple(inputs), tuple(constants), tuple(self.writer.field_names),
        tuple(n for n in self.writer.field_names if n not in self.writer.mode_flags.fields),
        bool(self.writer.draws))


def write_init(plan: ConstructorPlan, body: Sequence[cst.BaseStatement],
               leading_lines: Sequence[cst.EmptyLine] = ()) -> cst.FunctionDef:
  """`__init__(self, <fields>, *, <inputs>, <dtypes>, rngs)` of `plan`: the
  fields stored, then `body` (the creations) reading them as arguments."""
  def parameter(p: ConstructorParameter) -> cst.Param:
    return cst.Param(
        cst.Name(p.name), annotation=cst.Annotation(syntax.expression(p.annotation)) if p.annotation else None,
        default=syntax.expression(p.default) if p.default is not None else None,
        equal=cst.AssignEqual() if p.default is not None else cst.MaybeSentinel.DEFAULT)

  positional = [cst.Param(cst.Name('self'))] + [parameter(p) for p in plan.of_kind(ParameterKind.FIELD)]
  keyword_only = [parameter(p) for p in plan.parameters if p.kind is not ParameterKind.FIELD]
  # In `__init__` a field is its argument: `self.features` reads `features`,
  # but for a field a local of `__init__` takes the name of (`conv =
  # partial(self.conv, use_bias=False)`, as Linen's ResNet writes it).
  fields_read = set(plan.fields) - syntax.names_bound_by(body, (cst.AssignTarget,))

  class Arguments(cst.CSTTransformer):
    def leave_Attribute(self, original, updated):
      if syntax.self_attribute(updated) in fields_read:
        return cst.Name(updated.attr.value)
      return updated

  statements = [syntax.statement(f'self.{n} = {n}\n') for n in plan.stored]
  if plan.keeps_rngs:
    # `self.make_rng(stream)` draws from the Rngs the model is built with,
    # shared, in the order the model draws (Linen splits keys by path).
    statements.append(syntax.statement('self.rngs = rngs\n'))
  statements += [s.visit(Arguments()) for s in body]
  return cst.FunctionDef(
      name=cst.Name('__init__'),
      params=cst.Parameters(params=positional, star_arg=cst.ParamStar(), kwonly_params=keyword_only),
      body=cst.IndentedBlock(statements),
      leading_lines=list(leading_lines),
  )


def optional_if_none(annotation: cst.Annotation, default) -> cst.Annotation:
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
