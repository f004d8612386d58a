"""What of a Linen class the port does not write, refused with why
(`Untranslatable`, through the writer's `fail`) as the class writer reads
the class: a class the trace sees called only inside a transform, methods
under a lifted transform other than the scan of a compact `__call__`, a
mode flag configured off where NNX's `model.eval()` sets it, Linen modules
made outside the model held in fields, Linen's class decorators, and
Linen's names left in the creating method once its creations are NNX's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from flax import linen as nn

from converters.port import lifted_classes, linen_transforms, references, syntax

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


def refuse_calls_unseen(writer: ClassWriter) -> None:
  """Refuses a class whose first call seen is another method's than
  `__call__`, except a `setup()` class with no `__call__`, called through
  its methods (Gemma's `Embedder.encode` / `.decode`: written from the
  first one called)."""
  cls, instance = writer.cls, writer.instance
  through_methods = 'setup' in vars(cls) and not any('__call__' in vars(c) for c in cls.__mro__) and bool(
      instance.calls)
  if not instance.calls or instance.calls[0].method != '__call__' and not through_methods:
    # Its first call seen is another method's (nn.RNN asks a cell for its
    # `initialize_carry`, then calls it inside its scan, unseen). (Flax's
    # own cells are read from their kernels; a class of the user's has no
    # such spec.)
    writer.fail(writer.cdef, f'{cls.__name__} is called only inside a transform (a cell under nn.RNN, say), '
                'where the trace does not see its inputs; port it by hand')


def refuse_lifted_methods(writer: ClassWriter) -> None:
  """Refuses methods Linen runs under a lifted transform, called or not
  (the port writes no other), but Linen's scan over the inputs of a
  compact `__call__` and its remat, where the writer writes them
  (`writes_lifted_call`)."""
  def written(d: cst.Decorator) -> bool:
    return lifted_classes.is_method_scan(d, writer.file) or lifted_classes.is_method_remat(d, writer.file)

  def lifted_by(d: cst.Decorator) -> bool:
    return written(d) or references.linen_transform(d.decorator, writer.file) is not None

  lifted = {m for i in writer.instances for m in i.lifted_methods}
  for statement in writer.cdef.body.body:
    if isinstance(statement, cst.FunctionDef) and statement is not writer.call and any(
        lifted_by(d) for d in statement.decorators):
      lifted.add(statement.name.value)
  writes = writer.writes_lifted_call and all(written(d) for d in writer.call.decorators if lifted_by(d))
  if lifted - {'__call__'} or (lifted and not writes):
    kinds = {lifted_classes.decorating_transform(d, writer.file) for statement in writer.cdef.body.body
             if isinstance(statement, cst.FunctionDef) and statement.name.value in lifted
             for d in statement.decorators} - {None}
    advice = '; '.join(linen_transforms.by_hand(k) for k in sorted(kinds)) if kinds else 'port it by hand'
    writer.fail(writer.call if '__call__' in lifted else writer.cdef,
                f'{", ".join(sorted(lifted))} decorated with a lifted transform the port does not write '
                f'(it writes nn.scan over the inputs of a compact __call__ and nn.remat of it); {advice}')


def refuse_merged_flags_off(writer: ClassWriter) -> None:
  """Refuses an instance configured `deterministic=False` (any merged mode
  flag): the checks run the port in eval mode (which sets the attribute),
  as NNX's layers are run, so training is asked for at the call."""
  for name in sorted(writer.mode_flags.merged):
    if any(getattr(i.module, name) is False for i in writer.instances):
      writer.fail(writer.cdef, f'{writer.cls.__name__} is configured {name}=False, a field NNX\'s model.eval() / '
                  f'.train() set: configure it None and give {name}=False to the call (the factory\'s '
                  'keyword), as a training step does; or port it by hand')


def refuse_linen_modules_held(writer: ClassWriter) -> None:
  """Refuses a field holding a Linen module made outside the model. One the
  model makes and hands on (one embedding shared by an encoder and a
  decoder) is handed on in NNX too; one made outside is Linen's, which NNX
  cannot call."""
  for name in writer.field_names:
    for held in writer.instances:
      value = getattr(held.module, name)
      if isinstance(value, nn.Module) and (value.scope is None or not value.path):
        writer.fail(writer.cdef, f'the field {name!r} holds a Linen module made outside the model; NNX modules '
                    'are built in __init__, from arguments: port it by hand')


def refuse_linen_decorators(writer: ClassWriter) -> None:
  """Refuses a class decorated with anything of Linen's."""
  for decorator in writer.cdef.decorators:
    if writer.file.linen_path(decorator.decorator) is not None:
      writer.fail(decorator, f'the class is decorated with {writer.file.code(decorator.decorator)}; '
                  'port it by hand')


def refuse_linen_names_left(writer: ClassWriter) -> None:
  """Refuses Linen's names left in the creating method once the creations
  are NNX's: checked on the source, where each has its line."""
  writer.method.body.visit(references.LinenReferences(
      writer.file, writer.cls, strict=True,
      skip=[node.func for node, _ in writer.sites.values()]
      + [partial.args[0].value for partial in writer.factories.values()] + writer.lift_calls
      + list(writer.handed) + list(writer.untraced_branches)
      + [shared.statement for shared in writer.shared_scopes.values()],
      bound=syntax.bound_in(writer.method),
  ))
