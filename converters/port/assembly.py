"""The NNX class assembled from what its writer wrote: `__init__` (the input
sizes' placeholders written as the constructor's parameters, laid out as
Flax's code is, its cache part split off as `init_cache`) where the creating
method was, the class's other statements after it, rewritten for NNX, its
merged mode flags as NNX merges them (`first_from`), and the fields nothing
reads any more left out of `__init__`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import (
  caches,
  handed,
  helpers,
  layers,
  linen_api,
  mode_flags,
  references,
  syntax,
)

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter
  from converters.port.constructor import InputParameter


def finished_init(writer: ClassWriter, init: cst.FunctionDef,
                  inputs: list[InputParameter]) -> tuple[cst.FunctionDef, cst.FunctionDef | None]:
  """`init`, the constructor's `__init__`, with its input sizes read off
  `inputs`, read through the fields' aliases and laid out; then split into
  `__init__` and `init_cache` (None where it makes no cache)."""
  init = init.visit(syntax.Substitute(_input_sizes(inputs))).visit(syntax.DropSelfAssignments())
  init = init.with_changes(body=init.body.with_changes(
      body=syntax.through_aliases(list(init.body.body), set(writer.field_names))))
  # `__init__` is the port's own code: laid out as Flax's code is.
  init = init.with_changes(body=init.body.visit(
      syntax.LaidOut(writer.file.module.default_indent, 2 * writer.file.module.default_indent)))
  return caches.split_init(init, writer, {p.name for p in inputs})


def _input_sizes(inputs: list[InputParameter]) -> dict[str, str]:
  """The placeholder of each dimension of an input the constructor reads
  (`__input_0_1`) -> its source: the parameter, or its element
  (`x_shape[-1]`) for one taking the whole shape."""
  placeholders = {}
  for parameter in inputs:
    for dim in range(parameter.ndim):
      axis = dim - parameter.ndim if dim == parameter.ndim - 1 else dim - (not parameter.with_batch)
      placeholders[f'__input_{parameter.index}_{dim}'] = (
          f'{parameter.name}[{axis}]' if parameter.whole_shape else parameter.name)
  return placeholders


def class_def(writer: ClassWriter, init: cst.FunctionDef, init_cache: cst.FunctionDef | None,
              methods: dict) -> cst.ClassDef:
  """The NNX class statement: `init` (and `init_cache`) where the creating
  method was, then the class's other statements, `methods` rewritten."""
  body = _body(writer, init, init_cache, methods)
  bases = [
      b.with_changes(value=syntax.expression('nnx.Module'))
      if references.is_linen(b.value, writer.file, 'Module') else b
      for b in writer.cdef.bases
  ]
  node = writer.cdef.with_changes(bases=bases, body=writer.cdef.body.with_changes(body=body))
  if writer.mode_flags.merged:
    node = node.visit(_FirstFrom(writer.mode_flags.merged))
  node = node.visit(references.LinenReferences(writer.file, writer.cls, strict=False))
  # The fields the file reads off something else than `self`
  # (`self.encoder.config`, `model.features`) are kept on the port.
  read_elsewhere = set(writer.field_names) & writer.file.attributes_read_off_others
  return _without_dead_fields(
      node, [n for n in writer.field_names if n not in writer.mode_flags.fields and n not in read_elsewhere])


def _body(writer: ClassWriter, init: cst.FunctionDef, init_cache: cst.FunctionDef | None,
          methods: dict) -> list[cst.CSTNode]:
  """The statements of the NNX class, in the Linen class's order: its
  fields left to the constructor, its methods rewritten; `__init__` (and
  `init_cache`) before the other methods, as NNX classes are read."""
  body = []
  for statement in writer.cdef.body.body:
    if statement is writer.method:
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
      body.append(statement.visit(_CarryOfOwnCell(writer)).visit(linen_api.Draws()))
    else:
      body.append(statement)
  made = [init] + ([init_cache] if init_cache is not None else [])
  first = next((k for k, s in enumerate(body) if isinstance(s, cst.FunctionDef)), len(body))
  if body[first:first + len(made)] != made:
    body = body[:first] + made + [s for s in body[first:] if all(s is not m for m in made)]
  # A blank line before each method after the first, as PEP 8 spaces them
  # (the Linen class's first method had none before it).
  return [s.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) if isinstance(s, cst.FunctionDef) and k > first
          and not s.leading_lines else s for k, s in enumerate(body)]


def helper_functions(writer: ClassWriter) -> dict[str, cst.FunctionDef]:
  """The file's functions the port writes for the class, by name: those
  that make its layers (`converters.port.helpers`) and those it hands
  itself to (`converters.port.handed`)."""
  return {**{h.node.name.value: h.node for h in writer.helpers.values()},
          **{c.function.name.value: handed.nnx_function(c.function, c.held).visit(
              references.LinenReferences(writer.file, None, strict=False))
             for c in writer.handed_calls.values()}}


class _FirstFrom(cst.CSTTransformer):
  """Each merge of a flag in `names` as NNX merges it (`first_from`)."""

  def __init__(self, names: set[str]):
    self.names = names

  def leave_Call(self, original, updated):
    return first_from(updated) if mode_flags.merged_name(original) in self.names else updated


def first_from(node: cst.Call) -> cst.Call:
  """`nn.module.merge_param('deterministic', self.deterministic, deterministic)`
  as NNX's layers merge their modes: the argument, else the attribute
  (`first_from(deterministic, self.deterministic, error_msg=...)`). Linen
  refuses both given; NNX's `model.eval()` sets the attribute of every
  module, so there the argument must win (where Linen would run, both agree)."""
  name = node.args[0].value.evaluated_value
  return syntax.expression(
      f"first_from({name}, self.{name}, error_msg='{name}: not given, nor set by model.eval()')")


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
      if syntax.is_self(n.value) and n not in kept:
        read.update(fields if n.attr.value == '__dict__' else {n.attr.value})

    def visit_Call(self, n):
      if isinstance(n.func, cst.Name) and n.func.value in ('getattr', 'vars', 'setattr') \
          and not _of_another_object(n):
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


def _of_another_object(call: cst.Call) -> bool:
  """Whether `getattr(...)` (`vars`, `setattr`) reads a name that is not
  `self` nor under it: `getattr(jax.checkpoint_policies, self.policy)`."""
  first = call.args[0].value if call.args and not call.args[0].star else None
  while isinstance(first, cst.Attribute):
    first = first.value
  return isinstance(first, cst.Name) and first.value != 'self'


def _is_field_assignment(assign: cst.Assign, fields) -> bool:
  """`self.x = x` for a field `x`."""
  target = assign.targets[0].target if len(assign.targets) == 1 else None
  return (syntax.self_attribute(target) in fields and isinstance(assign.value, cst.Name)
          and assign.value.value == target.attr.value)
