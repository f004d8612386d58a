"""How the sizes Linen infers depend on a module's configuration and inputs.

Linen layers infer their input sizes on first call; an NNX port takes them
when it is built. `symbolic_trace(created)` traces one module again with its
integer fields (in nested configuration dataclasses and tuples too) and its
inputs' dimensions replaced by `jax.export` symbolic dimensions: every size
the trace records is then an expression of them (`2*s3`, `s1*floordiv(s4,
2)`), which `SymbolTable.source` writes as Python source in terms of the
module's own attributes (`self.config.hidden * 2`) and its inputs' shapes.
A field that cannot be symbolic (a loop count, a size checked against a
constant) stays concrete: its value enters expressions as the number it is,
so the port is right for every configuration that keeps it.
"""

from __future__ import annotations

import ast
import copy as copy_module
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
from flax import linen as nn
from jax import export

from converters.port import sizes, tracing


@dataclasses.dataclass(frozen=True)
class InputDim:
  """Dimension `dim` of the module's `index`-th array input (`name` in its
  signature), whose value in the traced call was `size`."""

  index: int
  name: str
  dim: int
  ndim: int
  size: int


@dataclasses.dataclass(frozen=True)
class FieldValue:
  """An integer the module's configuration holds, at `access` from `self`:
  `('config', 'hidden')` is `self.config.hidden`, `('features', 0)` is
  `self.features[0]`."""

  access: tuple
  last: bool = False  # the last element of its tuple (written `[-1]`)


Origin = InputDim | FieldValue


class SymbolTable:
  """Symbols of one trace and what each stands for."""

  def __init__(self):
    self.origins: dict[str, Origin] = {}

  def new(self, origin: Origin) -> str:
    name = f's{len(self.origins)}'
    self.origins[name] = origin
    return name

  def symbols_in(self, value) -> set[str]:
    """The symbols an expression (or a number) uses."""
    if isinstance(value, int):
      return set()
    tree = ast.parse(str(value), mode='eval')
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in self.origins}

  def source(self, value, name_of) -> str:
    """Python source of `value` (an int or a symbolic dimension), each
    symbol written as `name_of(origin)` returns it."""
    if isinstance(value, int):
      return str(value)
    tree = sizes.readable(str(value))
    table = self

    class Rewrite(ast.NodeTransformer):
      def visit_Name(self, node):
        if node.id in table.origins:
          return ast.parse(name_of(table.origins[node.id]), mode='eval').body
        return node

    return ast.unparse(Rewrite().visit(tree))


def _field_leaves(value, access: tuple) -> list[tuple[tuple, int]]:
  """`(access, int)` of every integer in a field's value: the value itself,
  a tuple's elements, a (non-module) dataclass's fields, recursively."""
  if isinstance(value, bool) or isinstance(value, nn.Module):
    return []
  if isinstance(value, int):
    return [(access, value)]
  if isinstance(value, tuple) and not hasattr(value, '_fields'):
    return [leaf for i, v in enumerate(value) for leaf in _field_leaves(v, access + (i,))]
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return [
        leaf
        for f in dataclasses.fields(value)
        if f.init
        for leaf in _field_leaves(getattr(value, f.name), access + (f.name,))
    ]
  return []


def _is_last(value, access: tuple) -> bool:
  """Whether `access` ends at the last element of a tuple of several."""
  for a in access[:-1]:
    value = value[a] if isinstance(a, int) else getattr(value, a)
  return bool(access) and isinstance(access[-1], int) and len(value) > 1 and access[-1] == len(value) - 1


def _replaced(value, access: tuple, new):
  """`value` with the integer at `access` (relative) replaced by `new`."""
  if not access:
    return new
  head, rest = access[0], access[1:]
  if isinstance(value, tuple):
    items = list(value)
    items[head] = _replaced(items[head], rest, new)
    return tuple(items)
  # Not `dataclasses.replace`: a configuration's own checks (`isinstance(v,
  # int)`) would refuse a symbol, and the trace asks for sizes, not checks.
  copy = copy_module.copy(value)
  object.__setattr__(copy, head, _replaced(getattr(value, head), rest, new))
  return copy


def module_fields(module: nn.Module) -> list[str]:
  """A Linen module's configuration fields (`parent` and `name` left out)."""
  return [f.name for f in dataclasses.fields(module) if f.init and f.name not in ('parent', 'name')]


def array_arguments(call: tracing.MethodCall, names: Sequence[str]) -> list[tuple[int, str, Any]]:
  """`(index, name, ShapeDtypeStruct)` of the call's positional array inputs."""
  return [
      (i, names[i] if i < len(names) else f'arg{i}', a)
      for i, a in enumerate(call.args)
      if isinstance(a, jax.ShapeDtypeStruct)
  ]


@dataclasses.dataclass
class SymbolicTrace:
  """A module traced with symbolic sizes: its record and the symbols' table."""

  root: tracing.Created
  table: SymbolTable
  inputs: list[tuple[int, str, Any]]


def symbolic_trace(created: tracing.Created, argument_names: Sequence[str]) -> SymbolicTrace:
  """`created`'s module traced alone, with every integer of its configuration
  and every dimension of its array inputs symbolic where the code allows it.

  Candidates are tried all at once, then, if the code refuses that (it
  compares a size with a constant, or loops over one), one at a time, keeping
  those it takes.
  """
  call = created.calls[0]
  module = created.module.clone(parent=None)
  field_leaves = [
      (name,) + access_value
      for name in module_fields(module)
      for access_value in [(a[1:], v) for a, v in _field_leaves(getattr(module, name), (name,))]
  ]
  inputs = array_arguments(call, argument_names)
  input_dims = [(i, name, d, a) for i, name, a in inputs for d in range(len(a.shape))]
  candidates = [('field', leaf) for leaf in field_leaves] + [('dim', dim) for dim in input_dims]

  def attempt(chosen):
    table = SymbolTable()
    names, constraints = [], []
    for kind, item in chosen:
      if kind == 'field':
        name, access, _ = item
        names.append(table.new(FieldValue((name,) + access, _is_last(getattr(module, name), access))))
      else:
        i, arg, d, a = item
        symbol = table.new(InputDim(i, arg, d, len(a.shape), a.shape[d]))
        names.append(symbol)
        constraints.append(f'{symbol} >= {a.shape[d]}')
    symbols = export.symbolic_shape(','.join(names), constraints=constraints) if names else ()
    values = dict(zip([c for c in chosen], symbols))
    fields = {}
    for (kind, item), symbol in values.items():
      if kind == 'field':
        name, access, _ = item
        fields[name] = _replaced(fields.get(name, getattr(module, name)), access, symbol)
    args = list(call.args)
    for (kind, item), symbol in values.items():
      if kind == 'dim':
        i, _, d, a = item
        shape = list(args[i].shape)
        shape[d] = symbol
        args[i] = jax.ShapeDtypeStruct(tuple(shape), a.dtype)
    root, _ = tracing.trace(module.clone(**fields), *args, **call.kwargs)
    return SymbolicTrace(root, table, array_arguments(root.calls[0], argument_names))

  try:
    return attempt(candidates)
  except Exception:  # noqa: BLE001 - the code refused some symbol: find which, one at a time
    pass
  kept = []
  for candidate in candidates:
    try:
      attempt(kept + [candidate])
    except Exception:  # noqa: BLE001
      continue
    kept.append(candidate)
  return attempt(kept)
