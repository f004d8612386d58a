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
import enum
import functools
import itertools
import types
from collections.abc import Sequence
from typing import Any

import jax
from flax import linen as nn
from jax import export

from converters import compat
from converters.port import layers, sizes, tracing
from converters.port.count_fits import Fitted, Unfitted, far_counts, linear, over_length


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


@dataclasses.dataclass(frozen=True)
class FieldLength:
  """The length of a tuple of the configuration, at `access` from `self`."""

  access: tuple


Origin = InputDim | FieldValue | FieldLength


class NotGeneral(ValueError):
  """A size holds at the traced configuration only (see `Unfitted`)."""


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
    if isinstance(value, Unfitted):
      raise NotGeneral(value.what)
    if isinstance(value, int):
      return str(value)
    tree = ast.parse(value.text, mode='eval').body if isinstance(value, Fitted) else sizes.readable(str(value))
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
  if isinstance(value, bool):
    return []
  if isinstance(value, nn.Module):
    # A Flax layer the model hands on (a shared embedding): its integer
    # fields that its NNX layer keeps by the same name (`features`).
    spec = layers.layer_spec(type(value))
    if spec is None or len(access) > 1:
      return []
    return [(access + (f,), getattr(value, f)) for f in module_fields(value)
            if spec.nnx_argument(f) == f and type(getattr(value, f)) is int]
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
  if isinstance(value, types.SimpleNamespace):  # vit_jax's `patches.size`
    return [leaf for name, v in vars(value).items() for leaf in _field_leaves(v, access + (name,))]
  return []


#: `beyond_sizes` of a flag, and of what is neither a size, a flag nor a
#: string (None, a callable, a float): a field left None where another
#: instance holds a width (`rep_size: int | bool`, `mlp_dim: int | None`).
_FLAG, _OPAQUE = object(), object()


def beyond_sizes(value):
  """What of `value` the symbolic trace cannot make a symbol of and that
  switches code: its strings and enum members, and whether it holds an
  integer (a size, a symbol) or something else there (inside tuples,
  configuration dataclasses and namespaces too). Two instances that differ
  there take other branches (a ViT's `classifier='gap'` adds no class token;
  `self.mlp_dim or 4 * d` with `mlp_dim=None`), so their sizes are not each
  other's symbolic ones. (Not which flag, initializer or float: a flag that
  makes other modules is told apart by them, and tracing each flag's
  instances alone costs a decoder its write time twice over; a size a flag
  alone switches is not proven, and so not handed over.)"""
  if isinstance(value, bool):
    return _FLAG
  if isinstance(value, (str, enum.Enum)):
    return value
  if isinstance(value, tuple) and not hasattr(value, '_fields'):
    return tuple(beyond_sizes(v) for v in value)
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return tuple(beyond_sizes(getattr(value, f.name)) for f in dataclasses.fields(value))
  if isinstance(value, types.SimpleNamespace):
    return tuple((k, beyond_sizes(v)) for k, v in vars(value).items())
  return None if isinstance(value, int) else _OPAQUE


def size_kinds(module) -> tuple:
  """`beyond_sizes` of each of `module`'s fields without the strings and
  enum members: where each holds an integer, a flag or something else
  (None). Two configurations that differ here run other code on the sizes
  (`mlp_dim or 4 * d` at None and at 12, where 4 * d may be 12 too)."""
  def kind(value):
    if isinstance(value, (str, enum.Enum)):
      return None
    if isinstance(value, tuple):
      return tuple(kind(v) for v in value)
    return value

  return tuple(kind(beyond_sizes(getattr(module, f))) for f in module_fields(module))


def value_at(value, access: Sequence):
  """What `access` reaches from `value`: `('size', 0)` is `value.size[0]`."""
  for a in access:
    value = value[a] if isinstance(a, int) else getattr(value, a)
  return value


def _is_last(value, access: tuple) -> bool:
  """Whether `access` ends at the last element of a tuple of several."""
  value = value_at(value, access[:-1])
  return bool(access) and isinstance(access[-1], int) and len(value) > 1 and access[-1] == len(value) - 1


def replaced_at(value, access: tuple, new):
  """`value` with the integer at `access` (relative) replaced by `new`."""
  if not access:
    return new
  head, rest = access[0], access[1:]
  if isinstance(value, tuple):
    items = list(value)
    items[head] = replaced_at(items[head], rest, new)
    return tuple(items)
  if isinstance(value, nn.Module):  # a layer handed on: a new one, adopted by the module traced
    return value.clone(parent=None, name=None, **{head: replaced_at(getattr(value, head), rest, new)})
  # Not `dataclasses.replace`: a configuration's own checks (`isinstance(v,
  # int)`) would refuse a symbol, and the trace asks for sizes, not checks.
  copy = copy_module.copy(value)
  object.__setattr__(copy, head, replaced_at(getattr(value, head), rest, new))
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


#: The factors a block may widen its input by (a bottleneck's `filters * 4`
#: features out): tried as such where a size or a condition is not a
#: field's value itself.
WIDENINGS = (2, 4)


@dataclasses.dataclass
class SymbolicTrace:
  """A module traced with symbolic sizes: its record and the symbols' table."""

  root: tracing.Created
  table: SymbolTable
  variables: dict = dataclasses.field(default_factory=dict)
  #: Input sizes the code ties to a field (`inputs - y`, y of `channels`
  #: features): traced as that field, so the port is written for inputs
  #: whose size is the field's value only (`prove` keeps them so).
  ties: dict[InputDim, FieldValue] = dataclasses.field(default_factory=dict)


def symbolic_trace(created: tracing.Created, argument_names: Sequence[str]) -> SymbolicTrace:
  """`created`'s module traced alone, with every integer of its configuration
  and every dimension of its array inputs symbolic where the code allows it.

  Candidates are tried all at once, then, if the code refuses that (it
  compares a size with a constant, or loops over one), one at a time, keeping
  those it takes. An integer kept concrete (a count the code loops over) is
  traced again at two more values: a size that changes with it linearly
  (`head_dim * num_heads` for 3, 4, 5 heads) is written with it.
  """
  return _SymbolicTracer(created, argument_names).trace()


def _dim_size(candidate) -> int:
  """The traced size of an input dimension's candidate."""
  _, (_, _, d, a) = candidate
  return a.shape[d]


class _SymbolicTracer:
  """`symbolic_trace` of one module, step by step.

  A candidate for a symbol is `('field', (name, access, value))`, an integer
  of the configuration (`access` within the field `name`), or `('dim',
  (index, name, dim, ShapeDtypeStruct))`, a dimension of an array input.
  """

  def __init__(self, created: tracing.Created, argument_names: Sequence[str]):
    self.call = created.calls[0]
    self.module = created.module.clone(parent=None)
    self.field_leaves = [
        (name,) + access_value
        for name in module_fields(self.module)
        for access_value in [(a[1:], v) for a, v in _field_leaves(getattr(self.module, name), (name,))]
    ]
    inputs = array_arguments(self.call, argument_names)
    input_dims = [(i, name, d, a) for i, name, a in inputs for d in range(len(a.shape))]
    self.candidates = [('field', leaf) for leaf in self.field_leaves] + [('dim', dim) for dim in input_dims]
    self.kept: list = []  # the candidates the code takes as symbols
    self.refused: list = []  # input dims the code refuses as symbols
    self.ties: dict = {}  # an input dim -> the field whose symbol it takes
    self.alone: dict = {}  # an input dim -> the step it can change by alone, or None
    self.followed: set = set()  # input dims traced along with a count
    #: `(chosen, table, symbols, trace)` of the last attempt the code took
    #: without a tie, which `trace` reuses when it chose the same.
    self.last_works: tuple | None = None

  def trace(self) -> SymbolicTrace:
    """The trace with the symbols the code takes, then each size that moves
    with a count (an integer kept concrete, an input's width, a tuple's
    length) written with it."""
    self._choose_symbols()
    counts = [
        ('field', leaf) for leaf in self.field_leaves
        if ('field', leaf) not in self.kept and isinstance(leaf[2], int) and not isinstance(leaf[2], bool)
    ]
    # The last axis of each input the code refuses as a symbol (a width it
    # splits or checks): a count of its own unless it only moves with a field.
    self.features = [dim for dim in self.refused if dim[1][2] == len(dim[1][3].shape) - 1]
    chosen = self.kept + counts + self.features
    if self.last_works is not None and self.last_works[0] == chosen and not self.ties:
      # The last attempt the code took substituted exactly these (no count
      # nor width is left concrete, no tie found): it is this trace.
      _, self.table, self.symbols, self.traced = self.last_works
    else:
      self.table, self.symbols = self._symbols_for(chosen)
      self.traced = self._retrace()
    self.traced.ties = {self._origin(dim): self._origin(field) for dim, field in self.ties.items()}
    for count in counts:
      self._fit_count(count)
    for dim in self.features:
      self._fit_width(dim)
    # A tuple's length is a count too (one layer per entry): traced one and two
    # entries longer (the last again), a size written with `len(...)`.
    for name, access, value in _tuples(self.module, self.kept):
      self._fit_tuple_length(name, access, value)
    return self.traced

  # --- the symbols

  def _origin(self, candidate) -> Origin:
    kind, item = candidate
    if kind == 'field':
      name, access, _ = item
      return FieldValue((name,) + access, _is_last(getattr(self.module, name), access))
    i, arg, d, a = item
    return InputDim(i, arg, d, len(a.shape), a.shape[d])

  def _symbols_for(self, chosen: list) -> tuple[SymbolTable, dict]:
    """A table with a symbol for each of `chosen` (an input dimension's at
    least its traced size), and the symbols by candidate."""
    table = SymbolTable()
    names, constraints = [], []
    for candidate in chosen:
      symbol = table.new(self._origin(candidate))
      names.append(symbol)
      if candidate[0] == 'dim':
        constraints.append(f'{symbol} >= {_dim_size(candidate)}')
    symbols = export.symbolic_shape(','.join(names), constraints=constraints) if names else ()
    return table, dict(zip(chosen, symbols))

  def _attempt(self, table, symbols, substituted, overrides=(), ties=None, dim_values=None) -> SymbolicTrace:
    """The module traced with the symbols of the candidates `substituted`,
    the field leaves `overrides` (`(leaf, value)`) and the input dims
    `dim_values` at other values, and each input dim of `ties` (the ties
    found, if None) at its field's symbol."""
    ties = self.ties if ties is None else ties
    fields = {}
    for (kind, item), symbol in symbols.items():
      if kind == 'field' and (kind, item) in substituted:
        name, access, _ = item
        fields[name] = replaced_at(fields.get(name, getattr(self.module, name)), access, symbol)
    for (name, access, _), value in overrides:
      fields[name] = replaced_at(fields.get(name, getattr(self.module, name)), access, value)
    args = list(self.call.args)
    dims = [(c, symbol) for c, symbol in symbols.items() if c[0] == 'dim' and c in substituted]
    dims += [(dim, symbols[field]) for dim, field in ties.items() if field in symbols]
    dims += list((dim_values or {}).items())
    for (_, item), symbol in dims:
      i, _, d, a = item
      shape = list(args[i].shape)
      shape[d] = symbol
      args[i] = jax.ShapeDtypeStruct(tuple(shape), a.dtype)
    # (An attempt the code refuses raises: the traceback is not read.)
    with compat.one_ceiling_form(), compat.unfiltered_tracebacks():
      root, variables = tracing.trace(
          self.module.clone(**fields), *args, traced_method=self.call.method, **self.call.kwargs)
    return SymbolicTrace(root, table, variables)

  def _works(self, chosen: list, ties=None) -> bool:
    """Whether the code takes the candidates `chosen` as symbols."""
    try:
      table, symbols = self._symbols_for(chosen)
      traced = self._attempt(table, symbols, set(chosen), ties=ties)
    except Exception:  # noqa: BLE001 - the code refused some symbol
      return False
    self.last_works = (list(chosen), table, symbols, traced) if ties is None else None
    return True

  def _choose_symbols(self) -> None:
    """`kept`: every candidate if the code takes them all, else those it
    takes one at a time; `refused`, the input dims it does not take."""
    self.kept = list(self.candidates)
    if self._works(self.kept):
      return
    self.kept = []
    for candidate in self.candidates:
      if self._works(self.kept + [candidate]):
        self.kept.append(candidate)
      elif candidate[0] == 'dim':
        self.refused.append(candidate)
        self._tie(candidate)

  def _tie(self, dim) -> None:
    """An input size the code ties to the configuration (`x + y` where y has
    `config.width` features) is that field: written with it, if exactly one
    field of its value makes the trace go through."""
    size = _dim_size(dim)
    fits = [
        field for field in self.kept
        if field[0] == 'field' and field[1][2] == size and not isinstance(field[1][2], bool)
        and self._works(self.kept, {**self.ties, dim: field})
    ]
    if len(fits) == 1:
      self.ties[dim] = fits[0]

  # --- the counts

  def _retrace(self, overrides=(), dim_values=None) -> SymbolicTrace:
    """The module traced with the symbols kept, and the field leaves
    `overrides` and the input dims `dim_values` at other values."""
    return self._attempt(self.table, self.symbols, set(self.kept), overrides, dim_values=dim_values)

  def _far_traces(self, counts, retrace_at) -> tuple[list[int], list[SymbolicTrace]]:
    """Those of `counts` the code takes, and the traces `retrace_at` each."""
    far, traces = [], []
    for n in counts:
      try:
        traces.append(retrace_at(n))
        far.append(n)
      except Exception:  # noqa: BLE001 - the code takes no such value of it
        continue
    return far, traces

  def _step_alone(self, dim) -> int | None:
    """The step (1 to 4) an input's width can change by, the configuration
    unchanged, or None."""
    if dim not in self.alone:
      size = _dim_size(dim)
      self.alone[dim] = None
      for step in (1, 2, 3, 4):
        try:
          self._retrace(dim_values={dim: size + step})
        except Exception:  # noqa: BLE001 - the code takes no such width
          continue
        self.alone[dim] = step
        break
    return self.alone[dim]

  def _fit_count(self, count) -> None:
    """The sizes that change with an integer kept concrete, written with it:
    traced at two more values, and far from it where a size moves."""
    leaf = count[1]
    base = leaf[2]
    # Input sizes the code ties to this count (`x + y`, y of `config.width`
    # features) follow it: tried with them, then without.
    # (Not one that changes alone too: equal to the count by coincidence.)
    tied = [dim for dim in self.refused if dim not in self.ties and _dim_size(dim) == base
            and (dim not in self.features or self._step_alone(dim) is None)]
    others = None
    # The next values the code takes, in steps of one or more (a width must
    # stay a multiple of the number of heads), or of the value itself (of
    # GroupNorm's 32 groups, say, which a smaller step leaves).
    steps = (1, 2, 3, 4, 8) + ((base,) if isinstance(base, int) and base > 8 else ())
    for step, follow in itertools.product(steps, [tied, []] if tied else [[]]):
      try:
        others = [
            self._retrace([(leaf, base + k * step)], {dim: base + k * step for dim in follow})
            for k in (1, 2)
        ]
        break
      except Exception:  # noqa: BLE001 - the code takes no such value of it
        continue
    if others is None:
      return
    self.followed |= set(follow)
    far, far_traces = self._far_traces(
        far_counts(base, step) if _sizes_move(others) else (),
        lambda n: self._retrace([(leaf, n)], {dim: n for dim in follow}))
    fit = functools.partial(linear, symbol=self.symbols[count], base=base,
                            what=access_source((leaf[0],) + leaf[1]), step=step, far=tuple(far))
    _fit_sizes(self.traced, others, fit, far_traces)

  def _fit_width(self, dim) -> None:
    """The sizes that change with the width of an input the code refuses as
    a symbol (one it splits or checks), written with it where the code takes
    other widths alone (not tied to a field nor following a count)."""
    step = None if dim in self.ties or dim in self.followed else self._step_alone(dim)
    if step is None:
      return
    size = _dim_size(dim)
    try:
      others = [self._retrace(dim_values={dim: size + k * step}) for k in (1, 2)]
    except Exception:  # noqa: BLE001 - the code takes one more width only
      return
    far, far_traces = self._far_traces(far_counts(size, step), lambda n: self._retrace(dim_values={dim: n}))
    fit = functools.partial(linear, symbol=self.symbols[dim], base=size,
                            what=f'the width of {dim[1][1]}', step=step, far=tuple(far))
    _fit_sizes(self.traced, others, fit, far_traces)

  def _fit_tuple_length(self, name: str, access: tuple, value: tuple) -> None:
    """The sizes that change with the length of a tuple of symbols, written
    with `len(...)`, where another length makes other layers."""
    elements = [self.symbols[('field', (name, access + (i,), v))] for i, v in enumerate(value)]
    length = self.table.new(FieldLength((name,) + access))
    # One shorter (without the entry before the last) and one longer where
    # the tuple has two entries or more, else one and two longer: the fewer
    # layers, the fewer sizes that may reach zero.
    shorter = len(elements) >= 2
    variants = [elements[:-2] + elements[-1:], elements + elements[-1:]] if shorter else [
        elements + elements[-1:], elements + elements[-1:] * 2]
    try:
      others = [self._retrace([((name, access, None), tuple(v))]) for v in variants]
    except Exception:  # noqa: BLE001 - the code takes no other length
      return
    if all(len(o.root.children) == len(self.traced.root.children) for o in others):
      # Not a count of layers (a kernel's or a patch's axes, `patches.size`:
      # another length is another program, not more layers): its length is
      # kept as traced, and the proof tries the entries changed instead.
      return
    order, start = ((1, 0, 2), len(value) - 1) if shorter else ((0, 1, 2), len(value))
    fit = functools.partial(over_length, length=length, order=order, base=start,
                            what=f'len({access_source((name,) + access)})')
    _fit_sizes(self.traced, others, fit)


def _sizes_move(others: list[SymbolicTrace]) -> bool:
  """Whether a size (a variable's, a layer input's) differs between the two
  traces at other counts: only then is a line fitted, and checked far away
  (a count that only repeats layers moves none, and its far traces are the
  dearest). The two are traced alike (`traced` has fits written in)."""
  def shapes(trace) -> dict:
    found = {('variable', jax.tree_util.keystr(p)): x.shape
             for p, x in jax.tree_util.tree_flatten_with_path(trace.variables)[0] if hasattr(x, 'shape')}
    seen: dict = {}
    for child in trace.root.children:
      n = seen[child.site] = seen.get(child.site, -1) + 1  # the site's n-th creation
      for k, x in enumerate(jax.tree.leaves(child.calls[0].args if child.calls else ())):
        if hasattr(x, 'shape'):
          found[('input', child.site, n, k)] = x.shape
    return found

  first, second = (shapes(o) for o in others[:2])
  return any(key in second and str(second[key]) != str(shape) for key, shape in first.items())


def access_source(access: tuple, last: bool = False) -> str:
  """`('config', 'features', 0)` as `__init__` reads it: `config.features[0]`
  (`[-1]` for the last entry of a tuple, when `last`)."""
  text = access[0]  # `__init__`'s argument of that name
  for k, a in enumerate(access[1:]):
    if isinstance(a, int):
      text += '[-1]' if last and k == len(access) - 2 else f'[{a}]'
    else:
      text += f'.{a}'
  return text


def _tuples(module, kept) -> list[tuple[str, tuple, tuple]]:
  """`(field, access, value)` of the tuples of integers all of whose entries
  are symbolic."""
  leaves = [item for kind, item in kept if kind == 'field']
  chosen = {(name, access) for name, access, _ in leaves}
  found = {}
  for name, access, _ in leaves:
    if access and isinstance(access[-1], int):
      found.setdefault((name, access[:-1]), None)
  out = []
  for name, access in found:
    value = value_at(getattr(module, name), access)
    if isinstance(value, tuple) and all((name, access + (i,)) in chosen for i in range(len(value))):
      out.append((name, access, value))
  return out


def _is_size(x) -> bool:
  return (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, (Fitted, Unfitted)) or type(
      x).__name__ == '_DimExpr'


def _combined_shapes(trees, fit, far: Sequence = ()):
  """The first tree of arrays, each size `fit` of its values in every tree,
  then in the trees `far` (None where one has no such array)."""
  def shapes_by_path(tree) -> dict:
    if tree is None:
      return {}
    return {p: x.shape for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
            if isinstance(x, jax.ShapeDtypeStruct)}

  far_shapes = [shapes_by_path(t) for t in far]

  def leaf(path, a, *others):
    if isinstance(a, jax.ShapeDtypeStruct) and all(len(o.shape) == len(a.shape) for o in others):
      columns = [s.get(path) if s.get(path) is not None and len(s[path]) == len(a.shape) else (None,) * len(a.shape)
                 for s in far_shapes]
      shape = tuple(fit(sizes) if _is_size(sizes[0]) else sizes[0]
                    for sizes in zip(a.shape, *(o.shape for o in others), *columns))
      return jax.ShapeDtypeStruct(shape, a.dtype)
    return a

  try:
    return jax.tree_util.tree_map_with_path(leaf, *trees)
  except (ValueError, TypeError):  # the count changes the structure: keep the first
    return trees[0]


def _same_creation(child, root, other_root):
  def key(c, parent):
    return c.site, [x for x in parent.children if x.site == c.site].index(c)

  wanted = key(child, root)
  return next((c for c in other_root.children if key(c, other_root) == wanted), None)


def _fit_sizes(traced: SymbolicTrace, others: list[SymbolicTrace], fit, far: Sequence = ()) -> None:
  """`traced` with each size `fit` of its values in `traced` and `others`
  (a count, or a tuple's length, one and two more), then in the traces at
  counts `far` from it (None where a layer is not in one of those)."""
  for child in traced.root.children:
    # The same layer in another trace: the same expression's k-th creation
    # (names shift when a loop before it runs another number of times).
    twins = [_same_creation(child, traced.root, o.root) for o in others]
    if None in twins:
      continue
    far_twins = [_same_creation(child, traced.root, o.root) for o in far]
    for k, call in enumerate(child.calls[:1]):
      calls = [t.calls[k] for t in twins]
      far_calls = [t.calls[k] if t is not None and len(t.calls) > k else None for t in far_twins]
      call.args = _combined_shapes([call.args] + [c.args for c in calls], fit,
                                   [c.args if c is not None else None for c in far_calls])
      call.outputs = _combined_shapes([call.outputs] + [c.outputs for c in calls], fit,
                                      [c.outputs if c is not None else None for c in far_calls])
    for field in module_fields(child.module):
      values = [getattr(child.module, field)] + [getattr(t.module, field) for t in twins]
      if all(_is_size(v) for v in values):
        values += [getattr(t.module, field, None) if t is not None else None for t in far_twins]
        object.__setattr__(child.module, field, fit(values))
  traced.variables = _combined_shapes([traced.variables] + [o.variables for o in others], fit,
                                      [o.variables for o in far])
