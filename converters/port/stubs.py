"""A class the port could not write: the stub written in its place, and the
interface the classes around it build and call it through.

One class the port cannot write stops at that class: its parents are
written around the stub (`StubPort` stands in for its port: they build it
from its Linen fields, the size of its first input as `in_features` and
`rngs`, and call it as Linen did), `PATHS` maps every variable outside it,
and the stub states that interface, quotes the Linen class and lists what
the trace saw it make, each Flax layer with the NNX class to write.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import textwrap

import jax
import libcst as cst

from converters.paths import format_path
from converters.port import constructor, layers, references, shapes, source, tracing
from converters.port.constructor import InputParameter
from converters.port.errors import Untranslatable


@dataclasses.dataclass
class Stub:
  """A class the port could not write: where and why."""

  cls: str
  line: int | None
  reason: str
  file: str
  #: Whether it makes a module where no traced configuration went
  #: (`errors.UntracedCreation`).
  untraced: bool = False

  def __str__(self) -> str:
    where = f'{self.file}:{self.line}' if self.line else self.file
    return f'{self.cls} ({where}): {self.reason}'


@dataclasses.dataclass
class UnportedBranch:
  """A branch of a written class no traced configuration took (`if
  self.resnet is not None:`), or one only a configuration the proof adds
  took and the port cannot write, written to raise: where, and its
  condition."""

  cls: str
  line: int
  #: The `if`'s test as the source writes it (`self.resnet is not None`),
  #: read with the Linen module as `self` in its file's globals.
  test: str
  #: Whether the branch is the `if`'s else: taken where `test` is false,
  #: as the `if` itself is where it is true (within the branches around it).
  is_else: bool
  file: str
  #: Why it is not written where a configuration the proof adds takes it
  #: (`branches.UntracedBranch.refused`); None where none does.
  refused: str | None = None

  @property
  def branch(self) -> str:
    """`the else branch of `if self.resnet is not None``, or `if`'s own."""
    return f'the else branch of `if {self.test}`' if self.is_else else f'`if {self.test}`'

  def __str__(self) -> str:
    why = 'was not traced' if self.refused is None else f'is not written ({self.refused})'
    return f'{self.cls} ({self.file}:{self.line}): {self.branch} {why}; it raises NotImplementedError'


@dataclasses.dataclass
class StubPort:
  """How the classes around a stub build and call it, as they would a
  written class (`classes.ClassPort`): no mode (its call keeps every
  argument Linen's took), no cache, and the inputs of its constructor.

  Attributes:
    cls: the Linen class.
    stub: why it is a stub.
    fields: its Linen fields, which its constructor takes first, in order.
    inputs: the input sizes its constructor takes (`in_features`, the last
      axis of its first input, where that is an array).
    call_parameters: Linen's `__call__` parameters, which the stub keeps.
  """

  cls: type
  stub: Stub
  fields: list[str]
  inputs: list[InputParameter]
  call_parameters: list[str]
  modes: dict[str, bool] = dataclasses.field(default_factory=dict)
  field_modes: dict[str, bool] = dataclasses.field(default_factory=dict)
  has_cache: bool = False


def stub_port(cls: type, instances: list[tracing.Created], stub: Stub) -> StubPort:
  fields = shapes.module_fields(instances[0].module)
  call = instances[0].calls[0] if instances[0].calls else None
  inputs = []
  if call is not None and call.args and getattr(call.args[0], 'ndim', 0):
    name = 'in_features'
    while name in fields:
      name = f'input_{name}'
    inputs.append(InputParameter(name, 0, 1, False))
  parameters = list(inspect.signature(cls.__call__).parameters)[1:]
  return StubPort(cls, stub, fields, inputs, parameters)


def stub_source(port: StubPort, instances: list[tracing.Created], variables: dict) -> str:
  """The stub class: the Linen class quoted above it, the interface it must
  keep (its constructor as the classes around it call it, Linen's
  `__call__`), and what the trace saw it make, to start from."""
  cls, stub = port.cls, port.stub
  try:
    lines, _ = inspect.getsourcelines(cls)
  except (OSError, TypeError):
    lines = []
  quoted = ''.join(f'# | {line.rstrip()}\n' if line.strip() else '# |\n' for line in lines)
  where = f'{os.path.basename(stub.file)}:{stub.line}' if stub.line else os.path.basename(stub.file)
  message = f'{cls.__name__} is a stub: {stub.reason}'
  keywords = [f'{p.name}: int' for p in port.inputs] + ['rngs: nnx.Rngs']
  init, call = _signatures(cls, port.fields)
  if init is None:  # its fields unread: by position or by name, as the classes around it give them
    init = ', '.join(['self', '*args', *keywords, '**kwargs'])
  else:
    init += ', *, ' + ', '.join(keywords)
  made = _made(instances[0], variables)
  sizes = f', {port.inputs[0].name} (the last axis of its first input)' if port.inputs else ''
  docstring = textwrap.fill(
      f'STUB, not ported: {stub.reason.removesuffix("; port it by hand")}. Port the Linen '
      'class quoted above by hand, keeping this constructor (the classes around it build it '
      f'so: its fields{sizes}, rngs) and its call (they call it as Linen did). Its variables '
      'are not in PATHS until then: `linen-nnx map` maps them once it is ported.',
      76, break_long_words=False, break_on_hyphens=False,
  )
  start = ''
  if made:
    start = '    # What it made when traced (the sizes of that configuration), to start from:\n' + ''.join(
        f'    #   {line}\n' for line in made)
  return (
      f'# STUB: not ported ({where}). The Linen class, to port by hand:\n{quoted}'
      f'class {cls.__name__}(nnx.Module):\n'
      f'  """{textwrap.indent(docstring, "  ").lstrip()}\n  """\n\n'
      f'  def __init__({init}):\n'
      f'{start}'
      f'    raise NotImplementedError({message!r})\n\n'
      f'  def __call__({call}):\n'
      f'    raise NotImplementedError({message!r})\n'
  )


def _signatures(cls: type, fields: list[str]) -> tuple[str | None, str]:
  """The stub's `__init__` parameters before its keywords (`self` and the
  fields, as the Linen class declares them; None where they cannot be read
  from it, inherited or its source unreadable) and its `__call__`'s
  (Linen's, as written; `*args, **kwargs` where it cannot be read)."""
  try:
    file = source.file_of(cls)
    cdef = file.class_def(cls)
    declared = constructor.declared_fields(cdef, cls, file, fields)
  except (LookupError, OSError, TypeError, Untranslatable):
    return None, 'self, *args, **kwargs'
  module = cst.Module([])
  init = ['self']
  for field in declared:
    value = field.value.visit(references.LinenReferences(file, cls, strict=False)) if field.value else None
    text = f'{module.code_for_node(field.target)}: {module.code_for_node(field.annotation.annotation)}'
    init.append(text + (f' = {module.code_for_node(value)}' if value is not None else ''))
  method = next((s for s in cdef.body.body if isinstance(s, cst.FunctionDef) and s.name.value == '__call__'), None)
  call = module.code_for_node(method.params) if method is not None else 'self, *args, **kwargs'
  return ', '.join(init), call


def _made(instance: tracing.Created, variables: dict) -> list[str]:
  """`Dense_0 -> nnx.Linear: kernel (8, 16), bias (16,)` for each module
  the traced instance made, and its own variables."""
  shapes = {
      tuple(getattr(k, 'key', str(k)) for k in path[1:]): getattr(leaf, 'shape', ())
      for path, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]
  }

  def held(prefix: tuple) -> str:
    found = [f'{format_path(p[len(prefix):])} {tuple(s)}' for p, s in shapes.items()
             if p[:len(prefix)] == prefix and len(p) == len(prefix) + 1]
    return ', '.join(found)

  out = []
  for child in instance.children:
    spec = layers.layer_spec(child.cls)
    kind = spec.nnx if spec is not None else (
        f'{child.cls.__name__} (written above)' if not layers.is_flax_class(child.cls)
        else f'flax.linen.{child.cls.__name__} (no NNX counterpart the port knows)')
    variables_of = held(child.path)
    out.append(f'{child.name} -> {kind}' + (f': {variables_of}' if variables_of else ''))
  own = held(instance.path)
  if own:
    out.append(f'its own variables: {own}')
  return out

