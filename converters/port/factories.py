"""What a class's method makes modules through besides a class by its name:
a partial bound to a local (`norm = functools.partial(nn.BatchNorm,
momentum=0.9)`), one of Linen's lifted transforms (`nn.scan(Block, ...)`),
a field holding a class (`self.conv`), a Flax layer class handed to a
user's block (`Inner(dense=nn.Dense)`).

`read` finds them (`Factories`); `Callees.target` says what a callee
names in the traced instance, and `factory_class` which module class that
makes. The writer decides how each is written (`classes.ClassWriter`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import libcst as cst
from flax import linen as nn

from converters.port import helpers, layers, lifted_classes, references, source, tracing

#: creation site -> `(expression, the modules made there)` (`ClassWriter.sites`).
Sites = Mapping[tracing.Site, tuple[cst.Call, list[tracing.Created]]]


@dataclasses.dataclass
class Factories:
  """Attributes:
    partials: locals that make modules, name -> the `partial` call. A
      creation through one is written with the partial's arguments and its
      own, as one NNX creation.
    lifts: sites creating through Linen's lifted transforms (`blocks =
      nn.scan(Block, ...)`, or `nn.scan(...)(config)` in place) -> (the
      transform read, the local holding it or None).
    lift_calls: the transforms' calls.
  """

  partials: dict[str, cst.Call]
  lifts: dict[tracing.Site, tuple[lifted_classes.Lifted, str | None]]
  lift_calls: list[cst.Call]


def is_partial(func: cst.BaseExpression, file: source.SourceFile) -> bool:
  """Whether `func` names `functools.partial` in `file`."""
  value = file.python_module
  for name in references.dotted(func) or ['']:
    value = getattr(value, name, None)
  return value is functools.partial


def is_partial_of(value: cst.BaseExpression, file: source.SourceFile) -> bool:
  """Whether `value` is `partial(<something>, ...)`, its first argument positional."""
  return (isinstance(value, cst.Call) and is_partial(value.func, file) and bool(value.args)
          and value.args[0].keyword is None and not value.args[0].star)


def factory_class(value) -> type | None:
  """The module class a factory makes (a partial's, recursively), or None."""
  while isinstance(value, functools.partial):
    value = value.func
  return value if isinstance(value, type) and issubclass(value, nn.Module) else None


@dataclasses.dataclass(frozen=True)
class Callees:
  """What the creating method's callees can name: the traced instance's
  fields, the method's locals bound once, the file's objects."""

  file: source.SourceFile
  module: nn.Module
  field_names: tuple[str, ...]
  locals: Mapping[str, cst.BaseExpression]

  def target(self, func: cst.BaseExpression):
    """What a partial's first argument (or a creation's callee) names: the
    traced value of a field (`self.conv`) or the file's object (`nn.BatchNorm`)."""
    names = references.dotted(func)
    if names and names[0] == 'self' and len(names) == 2 and names[1] in self.field_names:
      return getattr(self.module, names[1], None)
    local = self.locals.get(func.value) if isinstance(func, cst.Name) else None
    if isinstance(local, cst.Call) and is_partial(local.func, self.file) and local.args:
      inner = self.target(local.args[0].value)  # a partial of a local partial
      return functools.partial(inner) if callable(inner) else None
    return helpers.layer_class(self.file, func)


def read(sites: Sites, callees: Callees, keeps_handed_on: bool,
         fail: Callable[[cst.CSTNode, str], None]) -> Factories:
  """The factories the creations of `sites` go through; with
  `keeps_handed_on`, also the partials of a module class only handed on
  (`norm=norm` to a block), never called in the method."""
  bound, file = callees.locals, callees.file
  partials: dict[str, cst.Call] = {}
  lifts: dict[tracing.Site, tuple[lifted_classes.Lifted, str | None]] = {}
  lift_calls: list[cst.Call] = []
  for site, (node, children) in sites.items():
    local = node.func.value if isinstance(node.func, cst.Name) and node.func.value in bound else None
    value = bound[local] if local is not None else node.func
    if any(c.transform for c in children) and not isinstance(value, cst.Call):
      fail(node, f'{children[0].name} is made by a transform bound outside the method '
           f'({file.code(node.func)}); port it by hand')
    if isinstance(value, cst.Call) and any(c.transform for c in children):
      try:
        lift = lifted_classes.lifted(value, file, bound)
      except lifted_classes.Refused as e:
        fail(value, f'{e}: not written yet; {e.advice}')
      if lift is None:
        fail(node, f'{children[0].name} is made by a transform the port does not know; port it by hand')
      lifts[site] = (lift, local)
      lift_calls.append(value)
      if lift.through is not None:
        lift_calls.append(lift.through)
      continue
    if local is not None:
      if not is_partial_of(value, file):
        fail(node, f'a module created through {node.func.value}, which is not a '
             'functools.partial of a module class; port it by hand')
      partials[node.func.value] = value
  for name, value in bound.items() if keeps_handed_on else ():
    if (name not in partials and is_partial_of(value, file)
            and factory_class(callees.target(value.args[0].value)) is not None):
      partials[name] = value
  return Factories(partials, lifts, lift_calls)


def handed_classes(sites: Sites, file: source.SourceFile) -> dict[cst.BaseExpression, cst.BaseExpression]:
  """Flax layer classes handed to the user's modules as they are
  (`Inner(dense=nn.Dense)`), or as a partial written in place
  (`Inner(dense=partial(nn.Dense, use_bias=False))`): the Linen class
  (what the check of Linen's names skips) -> the argument's value."""
  handed = {}
  for node, children in sites.values():
    if layers.layer_spec(children[0].cls) is not None:
      continue
    for arg in node.args:
      value = arg.value
      head = value.args[0].value if is_partial_of(value, file) else value
      if file.linen_path(head) and not arg.star:
        if layers.layer_spec(helpers.layer_class(file, head)) is not None:
          handed[head] = value
  return handed
