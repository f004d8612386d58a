"""A condition on the call's arrays, written as one NNX can decide when it
builds: from the module's configuration and input sizes.

Linen code may create a module only for some inputs: ResNet's shortcut
projection exists `if residual.shape != y.shape`. NNX must decide in
`__init__`, before any array exists. `condition(writer, statement, sites)`
finds the condition from what the model does: the module is traced at every
configuration the model made of it and at configurations around each (each
integer one more, each tuple of integers all ones and all twos, each flag
flipped, the input size equal to each integer of the configuration and to
two and four times it, and each flag or tuple changed at each such size), noting
whether the modules under the `if` were created; the simplest condition on
the configuration and input sizes that agrees with every observation
(`in_features != filters or strides != (1, 1)`) is the one written. None
agreeing, or the observations never differing, is refused: nothing is
guessed.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import jax

from converters.port import shapes, tracing


@dataclasses.dataclass(frozen=True)
class _Atom:
  """A condition: its source, how it evaluates on a configuration, and
  whether it reads the input's size (the constructor then takes it)."""

  source: str
  holds: Callable[[dict, int], bool]  # (configuration, input size) -> value
  reads_size: bool = False

  def __or__(self, other: _Atom) -> _Atom:
    return _Atom(f'{self.source} or {other.source}', lambda c, s: self.holds(c, s) or other.holds(c, s),
                 self.reads_size or other.reads_size)

  def __and__(self, other: _Atom) -> _Atom:
    return _Atom(f'{self.source} and {other.source}', lambda c, s: self.holds(c, s) and other.holds(c, s),
                 self.reads_size or other.reads_size)


def _leaves(module) -> dict[tuple, object]:
  """Every integer, tuple of integers and flag of a module's configuration."""
  out = {}

  def walk(value, access):
    if isinstance(value, bool):
      out[access] = value
    elif isinstance(value, int):
      out[access] = value
    elif isinstance(value, tuple) and value and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value):
      out[access] = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type) and not hasattr(value, 'scope'):
      for f in dataclasses.fields(value):
        if f.init:
          walk(getattr(value, f.name), access + (f.name,))

  for name in shapes.module_fields(module):
    walk(getattr(module, name), (name,))
  return out


def _with(module, access, value):
  name, rest = access[0], access[1:]
  return module.clone(parent=None, **{name: shapes.replaced_at(getattr(module, name), rest, value)})


def _observations(instances, sites, array_index: int, site_of):
  """`(configuration, input size, created)` for each instance and around it."""
  seen = []

  def observe(module, args, kwargs):
    try:
      root, _ = tracing.trace(module, *args, **kwargs)
    except Exception:  # noqa: BLE001 - a configuration the code refuses: no observation
      return
    size = args[array_index].shape[-1]
    seen.append((_leaves(module), size, any(site_of(c) in sites for c in root.children)))

  for instance in instances:
    call = instance.calls[0]
    module = instance.module.clone(parent=None)
    args, kwargs = list(call.args), dict(call.kwargs)
    seen.append((_leaves(module), args[array_index].shape[-1],
                 any(site_of(c) in sites for c in instance.children)))
    leaves = _leaves(module)
    integers = {v for v in leaves.values() if isinstance(v, int) and not isinstance(v, bool)}
    sizes = {v * m for v in integers for m in (1, *shapes.WIDENINGS)} | {1, 2, args[array_index].shape[-1] + 1}

    def resized(size):
      a = args[array_index]
      return args[:array_index] + [jax.ShapeDtypeStruct(a.shape[:-1] + (size,), a.dtype)] + args[array_index + 1:]

    for access, value in leaves.items():
      variants = (
          [not value] if isinstance(value, bool)
          else [value + 1] if isinstance(value, int)
          else [(1,) * len(value), (2,) * len(value)]
      )
      for variant in variants:
        if variant != value:
          observe(_with(module, access, variant), args, kwargs)
          if not isinstance(value, int) or isinstance(value, bool):
            # A flag or strides changed with the input size too: a block
            # with strides (2, 2) has its shortcut whatever its input, and
            # one with (1, 1) only where the sizes differ.
            for size in sizes - {args[array_index].shape[-1]}:
              observe(_with(module, access, variant), resized(size), kwargs)
    for size in sizes:
      if size > 0:
        observe(module, resized(size), kwargs)
  return seen


def _atoms(leaves: dict, size_name: str) -> list[_Atom]:
  atoms = []
  for access, value in leaves.items():
    text = shapes.access_source(access)
    if isinstance(value, bool):
      atoms.append(_Atom(text, lambda c, s, a=access: bool(c.get(a))))
      atoms.append(_Atom(f'not {text}', lambda c, s, a=access: not c.get(a)))
    elif isinstance(value, int):
      atoms.append(_Atom(f'{size_name} != {text}', lambda c, s, a=access: s != c.get(a), True))
      atoms.append(_Atom(f'{size_name} == {text}', lambda c, s, a=access: s == c.get(a), True))
      atoms.append(_Atom(f'{text} != 1', lambda c, s, a=access: c.get(a) != 1))
      for m in shapes.WIDENINGS:  # a block widening its input (`filters * 4` features out)
        atoms.append(_Atom(f'{size_name} != {text} * {m}', lambda c, s, a=access, m=m: s != c.get(a) * m, True))
    else:
      ones = (1,) * len(value)
      atoms.append(_Atom(f'{text} != {ones!r}', lambda c, s, a=access, o=ones: c.get(a) != o))
      atoms.append(_Atom(f'{text} == {ones!r}', lambda c, s, a=access, o=ones: c.get(a) == o))
  return atoms


def condition(writer, statement, sites: set[tracing.Site]) -> str:
  """Source of the condition, on the constructor's arguments, under which
  the modules of `sites` (created under `statement`) exist; the input size
  written as `writer`'s placeholder for it. Fails through `writer.fail`."""
  arrays = [i for i, a in enumerate(writer.instance.calls[0].args) if hasattr(a, 'shape')]
  if not arrays:
    writer.fail(statement, 'a condition on the call of a module that takes no array; port it by hand')
  if len(arrays) > 1:
    writer.fail(statement, f'`if {writer.file.code(statement.test)}` in a module of several array '
                'inputs: the port learns conditions on the first input\'s size only; port it by hand')
  index = arrays[0]
  ndim = len(writer.instance.calls[0].args[index].shape)
  size_name = f'__input_{index}_{ndim - 1}'
  seen = _observations(writer.instances, sites, index, writer.site_of)
  if len({created for _, _, created in seen}) < 2:
    writer.fail(statement, f'the modules under `if {writer.file.code(statement.test)}` exist in every '
                'configuration tried, or in none: the port cannot tell when; port it by hand')
  atoms = _atoms(_leaves(writer.instance.module.clone(parent=None)), size_name)
  formulas = list(atoms)
  for a, b in itertools.combinations(atoms, 2):
    formulas += [a | b, a & b]
  for formula in formulas:
    if all(formula.holds(leaves, size) == created for leaves, size, created in seen):
      if formula.reads_size:
        writer.sizes.use_input_dim(index, ndim - 1)
      return formula.source
  writer.fail(statement, f'no condition on the configuration and input size agrees with when Linen '
              f'creates the modules under `if {writer.file.code(statement.test)}` (it may depend on '
              'other sizes of the inputs: strides on a 1x1 image change no shape; trace larger '
              'example inputs); port it by hand')
