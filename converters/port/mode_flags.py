"""A port's mode: the flags of a class's call and the fields of its
configuration that set its layers' modes (`deterministic=not train`,
`use_running_average=self.frozen`), which the port leaves to NNX's
`model.train()` / `.eval()`; and the fields its methods merge with the
call's flag of the same name (Flax's sst2 `deterministic`), which the port
keeps as the attribute the mode sets.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import libcst as cst

from converters.port import layers, references, syntax

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


#: The attributes NNX's `model.train()` / `.eval()` set on every module.
NNX_MODE_ATTRIBUTES = ('deterministic', 'use_running_average')


class ModeFlags:
  """The mode flags of one class, for its `ClassWriter`, recorded as the
  writer meets the arguments that set its layers' modes."""

  def __init__(self, writer: ClassWriter):
    self.writer = writer
    self.file, self.fail, self.cdef = writer.file, writer.fail, writer.cdef
    #: A flag of the call -> its value in training (`train` -> True).
    self.call: dict[str, bool] = {}
    #: A field (or a flag inside one, `config.deterministic`) -> its value in training.
    self.fields: dict[str, bool] = {}
    #: The expressions read as modes.
    self.reads: set = set()
    #: The fields merged with the call's flag of their name (`merge_param`).
    self.merged: set[str] = self._merged()

  def record(self, value: cst.BaseExpression, eval_value: bool, node) -> None:
    """Checks that a mode field's value is a call flag or a bool field of
    the module (or its negation) and records its value in training."""
    if self.reads_merged_flag(value):
      self.fail(node, f'{self.file.code(value)} sets a layer\'s mode where it is created, from the flag '
                'merged with the field of its name: give it where the layer is called '
                '(`layer(x, deterministic=deterministic)`), or port it by hand')
    negated = isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Not)
    inner = value.expression if negated else value
    train_value = eval_value if negated else not eval_value
    path = self.writer.field_path(inner)
    self.reads.add(inner)
    if path is not None and all(isinstance(value_at(i.module, path), bool) for i in self.writer.instances):
      # A flag of the configuration (`self.deterministic`,
      # `config.deterministic`) handed on to the layers: the port's mode too.
      if self.fields.setdefault(path, train_value) != train_value:
        self.fail(node, f'{path} sets modes both ways; port it by hand')
      return
    if isinstance(inner, cst.Name) and inner.value not in self.writer.params:
      alias = self.writer.locals.get(inner.value)
      if alias is not None:
        return self.record(
            cst.UnaryOperation(cst.Not(), alias) if negated else alias, eval_value, node
        )
    if not isinstance(inner, cst.Name) or inner.value not in self.writer.params:
      self.fail(
          node,
          f'{self.file.code(value)} sets a layer\'s mode from something other than an '
          'argument of __call__ or a bool field; port it by hand (NNX sets it with '
          'model.train() / .eval())',
      )
    if self.call.setdefault(inner.value, train_value) != train_value:
      self.fail(node, f'{inner.value} sets modes both ways; port it by hand')

  def check_fields_gone(self, node: cst.ClassDef, init: cst.FunctionDef) -> None:
    """A field taken as the mode is read nowhere else: NNX's mode replaces it.
    Nor do modes come both from the call and from the configuration: NNX has
    one mode, Linen then has states NNX cannot take."""
    if self.fields and self.call:
      self.fail(self.cdef, f'the layers\' modes come from the call ({", ".join(self.call)}) and from '
                f'the configuration ({", ".join(self.fields)}); NNX has one mode: port it by hand')
    flags = self.call or self.fields
    if len(flags) > 1:
      # `train` for dropout beside `update_stats` for batch statistics: frozen
      # statistics while fine-tuning is a state `model.train()` cannot give.
      self.fail(self.cdef, f'the layers\' modes come from {len(flags)} flags ({", ".join(sorted(flags))}), '
                'which Linen sets apart and NNX\'s one mode (`model.train()` / `.eval()`) would '
                'set together: port it by hand, each layer\'s `deterministic` / '
                '`use_running_average` set on its own')
    if not self.fields:
      return
    left = set()

    class Reads(cst.CSTVisitor):
      def visit_Attribute(self, n):
        if syntax.is_self(n.value):
          left.add(n.attr.value)

    node.visit(Reads())
    left |= syntax.names_in(init.body)
    for field in self.fields:
      if '.' not in field and field in left:
        self.fail(self.cdef, f'the field {field!r} sets the layers\' modes and does more (NNX sets '
                  'modes with model.train() / .eval()); port it by hand')
    dotted = {f for f in self.fields if '.' in f}
    writer, reads = self.writer, self.reads

    class DottedReads(cst.CSTVisitor):
      def visit_Attribute(self, n):
        if n not in reads and writer.field_path(n) in dotted:
          writer.fail(n, f'{writer.field_path(n)} sets the layers\' modes and does more (NNX sets '
                      'modes with model.train() / .eval()); port it by hand')

    if dotted:
      self.cdef.visit(DottedReads())

  def without_arguments(self, original: cst.Call, updated: cst.Call, child) -> cst.Call:
    """A call of a created module without the arguments that set what the
    NNX mode sets (`deterministic=not train` of a Dropout, `train` of a
    user module whose port took it as its mode)."""
    spec = layers.layer_spec(child.cls)
    if spec is not None:
      modes = dict(spec.mode)
      parameters = list(inspect.signature(child.cls.__call__).parameters)[1:]
    else:
      port = self.writer.child_ports.get(child.cls)
      modes = {} if port is None else {k: not v for k, v in port.modes.items()}
      parameters = [] if port is None else port.call_parameters
    if not modes:
      return updated
    kept = []
    for i, arg in enumerate(updated.args):
      name = arg.keyword.value if arg.keyword else (parameters[i] if i < len(parameters) else None)
      if name in modes and self.reads_merged_flag(original.args[i].value):
        kept.append(arg)  # the flag stays an argument: NNX's layers take it at the call too
        continue
      if name in modes:
        self.record(original.args[i].value, modes[name], original)
        continue
      kept.append(arg)
    return updated.with_changes(args=syntax.normalised(kept))

  def _merged(self) -> set[str]:
    """The fields named as NNX's modes that the class's methods merge with
    their argument of the same name, and read nowhere else: `deterministic =
    nn.module.merge_param('deterministic', self.deterministic, deterministic)`.
    Such a class is written as NNX's own layers are: the field an attribute
    that `model.train()` / `.eval()` set, the argument kept, the argument
    first (`first_from`), so a model in eval mode still runs as its call says."""
    merges, reads = {}, {}

    class Visitor(cst.CSTVisitor):
      def visit_Call(self, node):
        name = merged_name(node)
        if name is not None:
          merges[name] = merges.get(name, 0) + 1

      def visit_Attribute(self, node):
        if syntax.is_self(node.value):
          reads[node.attr.value] = reads.get(node.attr.value, 0) + 1

    self.cdef.visit(Visitor())
    return {n for n, count in merges.items()
            if n in NNX_MODE_ATTRIBUTES and n in self.writer.field_names and reads.get(n) == count}

  def reads_merged_flag(self, value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value in self.merged

  def _creates(self, value: cst.CSTNode) -> bool:
    """Whether `value` holds a creation (`nn.BatchNorm(use_running_average=
    not train)(y)`): the flag it reads sets that layer's mode, which the
    NNX mode sets."""
    finder = syntax.CallsAmong({node: site for site, (node, _) in self.writer.sites.items()})
    value.visit(finder)
    return bool(finder.found) or any(  # `block(x, deterministic)`, `block = Block(...)`
        isinstance(n, cst.Call) and self.writer.creation_named(n.func) is not None for n in syntax.descendants(value))

  def drop_flag(self, method: cst.FunctionDef, flag: str) -> cst.FunctionDef:
    aliases = {name for name, value in self.writer.locals.items()
               if value is not None and flag in syntax.names_in(value) and not self._creates(value)}

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
    if flag in syntax.names_in(method.body) or aliases & syntax.names_in(method.body):
      self.fail(
          self.writer.method,
          f'{flag!r} does more than set the layers\' modes (NNX sets them with model.train() / '
          '.eval()); port it by hand',
      )
    return method


def merged_name(node: cst.CSTNode) -> str | None:
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


def value_at(module, path: str):
  """The value at a dotted path of fields (`config.deterministic`), None where there is none."""
  value = module
  for name in path.split('.'):
    value = getattr(value, name, None)
  return value
