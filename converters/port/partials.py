"""The partials and fields a class makes its modules through, as its port
writes them: a creation through a local partial expanded into the direct
creation it stands for, or written through the partial `__init__` keeps (as
NNX's: `partial(nnx.BatchNorm, momentum=0.9)`, its mode arguments left to
the NNX mode), and a creation through a field the model is configured with
(`self.conv(...)`) checked to make one class at every creation.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import libcst as cst

from converters.port import factories, helpers, layers, references, syntax

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


class Partials:
  """The partials and configured fields of one class, for its `ClassWriter`
  (which holds the partials read, `factories`, and the creations)."""

  def __init__(self, writer: ClassWriter):
    self.writer = writer
    self.file, self.fail = writer.file, writer.fail
    #: The local partials the method reads as values (`conv=conv` handed to
    #: a block), which `__init__` keeps as NNX partials.
    self.kept: set[str] = self._kept()
    #: A field the model is configured with a module class or partial in
    #: (`conv: ModuleDef`) -> the Flax layer (its spec) or the user's class
    #: the traced configuration makes through it.
    self.fields: dict[str, object] = {}

  def nnx_handed(self, value: cst.BaseExpression) -> cst.BaseExpression:
    """A value `factories.handed_classes` found, as NNX's: `nnx.Linear`, or the
    partial as `nnx_factory` writes one."""
    if isinstance(value, cst.Call):
      return self._nnx_partial(value, self.file.code(value))
    return syntax.expression(layers.layer_spec(helpers.layer_class(self.file, value)).written)

  def _kept(self) -> set[str]:
    """The factory locals the method reads as values, not only as what its
    creations call (`conv=conv` handed to a block, as Flax's ResNet hands
    its `conv` and `norm`): `__init__` keeps them, as NNX partials
    (`nnx_factory`), and the creations through them are written through
    them. Their mode arguments (`use_running_average=not train`) leave
    them for the NNX mode, so they are not of the call."""
    callees = {node.func for node, _ in self.writer.sites.values()}
    partials = self.writer.factories
    read: set[str] = set()

    class Reads(cst.CSTVisitor):
      def visit_AssignTarget(self, node):
        return False

      def visit_Name(self, node):
        if node.value in partials and node not in callees:
          read.add(node.value)

    if not self.writer.keeps_factories:
      return set()
    self.writer.method.body.visit(Reads())
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
          if not any(self.writer.call_time & syntax.names_in(a.value) for a in partials[name].args
                     if not (a.keyword is not None and a.keyword.value in self._modes(partials[name])))
      ]
      if not leave:
        return read
      for name in leave:
        self.writer.call_time.discard(name)
        pending.remove(name)

  def _modes(self, partial: cst.Call) -> dict[str, bool]:
    """The fields of a factory's class its mode sets: field -> whether True
    is the eval mode (`use_running_average` of a BatchNorm)."""
    cls = factories.factory_class(self.writer.callees.target(partial.args[0].value))
    spec = layers.layer_spec(cls) if cls is not None else None
    if spec is not None:
      return dict(spec.mode)
    port = self.writer.child_ports.get(cls)
    return {} if port is None else {f: not train for f, train in port.field_modes.items()}

  def nnx_factory(self, name: str) -> cst.Call:
    """A kept factory as `__init__` writes it: `partial(nn.BatchNorm,
    use_running_average=not train, momentum=0.9)` -> `partial(nnx.BatchNorm,
    momentum=0.9)` (Linen's class as NNX's, the mode arguments left to the
    NNX mode, fields NNX names otherwise renamed)."""
    return self._nnx_partial(self.writer.factories[name], name)

  def _nnx_partial(self, partial: cst.Call, name: str) -> cst.Call:
    """`partial` (`name` says what it is in messages) as NNX's: see `nnx_factory`."""
    head = partial.args[0].value
    target = self.writer.callees.target(head)
    cls = factories.factory_class(target)
    spec = layers.layer_spec(cls) if cls is not None else None
    names = references.dotted(head)
    from_field = bool(names) and names[0] == 'self'
    if cls is None or (spec is None and cls not in self.writer.child_ports):
      self.fail(partial, f'{name} = {self.file.code(partial)} makes no module the port writes; port it by hand')
    if not from_field and spec is not None:
      head = syntax.expression(spec.written)
    elif not from_field and not (isinstance(head, cst.Name) and head.value == cls.__name__):
      self.fail(partial, f'{name} is a partial of {self.file.code(head)}, which is not the class by its own '
                'name; port it by hand')
    modes = self._modes(partial)
    args = [cst.Arg(head)]
    for arg in partial.args[1:]:
      if arg.star or arg.keyword is None:
        self.fail(partial, f'{name} = {self.file.code(partial)} passes arguments by position; NNX\'s '
                  'constructors take the input size first: port it by hand')
      field = arg.keyword.value
      if field in modes:
        self.writer.mode_flags.record(arg.value, modes[field], partial)
        continue
      if self.writer.call_time & syntax.names_in(arg.value):
        self.fail(partial, f'{field}={self.file.code(arg.value)} of {name} depends on the inputs of the call; '
                  'port it by hand')
      nnx_name = spec.nnx_argument(field) if spec is not None else field
      if spec is not None and nnx_name not in spec.nnx_parameters():
        self.fail(partial, f'{spec.nnx} has no argument {nnx_name!r} for Linen\'s {field!r}; port it by hand')
      args.append(syntax.keyword(nnx_name, arg.value))
    if len(args) == 1:
      return head  # nothing left but the mode: the class itself (`BlockD`, not `partial(BlockD)`)
    return partial.with_changes(args=syntax.normalised(args))

  def given_by_kept(self, node: cst.Call) -> set[str]:
    """The Linen fields a kept factory the creation goes through sets."""
    if isinstance(node.func, cst.Name) and node.func.value in self.kept:
      return {a.keyword.value for a in self.writer.factories[node.func.value].args[1:] if a.keyword is not None}
    return set()

  def field_factory(self, node: cst.Call, func: cst.BaseExpression, children) -> str | None:
    """The field a creation calls (`self.conv(...)`, `self.block_cls(...)`),
    checked: each instance's value a class or a partial with keywords only,
    the same class at every creation. None for a creation that is not one."""
    names = references.dotted(func)
    if not (names and names[0] == 'self' and len(names) == 2 and names[1] in self.writer.field_names):
      return None
    field = names[1]
    for instance in self.writer.instances:
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
    if self.fields.setdefault(field, made) is not made:
      self.fail(node, f'the field {field!r} makes both {made_name(made)} and '
                f'{made_name(self.fields[field])}; port it by hand')
    if isinstance(made, layers.LayerSpec) and made.linen_defaults:
      self.fail(node, f'{cls.__name__} made through the field {field!r}: NNX\'s {made.nnx} wants '
                f'{", ".join(made.linen_defaults)} where Linen has a default, which the field\'s value '
                'may set; port it by hand')
    for instance in self.writer.instances:
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
      port = self.writer.child_ports.get(cls)
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
    if not (isinstance(node.func, cst.Name) and node.func.value in self.writer.factories):
      return node
    if node.func.value in self.kept:
      return node  # written through the partial `__init__` keeps
    partial = self.writer.factories[node.func.value]
    given = {a.keyword.value for a in node.args if a.keyword is not None}
    positional = [a for a in partial.args[1:] if a.keyword is None] + [a for a in node.args if a.keyword is None]
    keywords = [a for a in partial.args[1:] if a.keyword is not None and a.keyword.value not in given]
    keywords += [a for a in node.args if a.keyword is not None]
    return cst.Call(partial.args[0].value, syntax.normalised(positional + keywords))


def made_name(made) -> str:
  """The name of what a factory field makes: a Flax layer's spec or a class."""
  return made.linen.__name__ if isinstance(made, layers.LayerSpec) else made.__name__
