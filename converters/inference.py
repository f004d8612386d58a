"""Inferring the Linen <-> NNX path mapping from what the two models compute.

`infer_paths(linen_module, nnx_model, *example_args)` traces both forward
passes abstractly (`jax.make_jaxpr` on `ShapeDtypeStruct`s: no FLOPs, no
parameter memory) and matches every variable by where the computation
consumes it, never by its name: the primitive and operand position of its
first use (positions of operands that commute do not count), the chain of
operations its result flows into, its shape, dtype and collection, and the
order in which the computation first uses it. Variables used alike pair in
that order only when it is their layer order or nothing tells them apart on
either side; otherwise they are refused, not guessed. Names pair only
variables the forward pass never reads. Layers repeated in a loop fold into
`{i}` templates, so the result is the short mapping a person would write
(`PathMapping.to_python()` prints it).

`infer_paths` maps two models of one layout (looped and looped, or scanned
and scanned; a stacked variable maps as one array), and a model that scans
beside one that loops: both are traced again with scans unrolled and calls
inlined, each layer sliced out of a stacked variable pairs like a looped
one, and the rule keeps each side in its own layout (`PathRule(None,
'blocks/{i}/w', linen_stacked='ScanBlock_0/w')`). `merge_layouts` joins the
mappings of both layouts into rules with all four paths. `infer_models` is
what `paths='infer'` of the conversions runs: a `LinenModel` and an NNX
model, or factories of both layouts. Ports that reshaped or fused a
parameter (fused attention) need a hand-written rule for it (`paths=` rules
take precedence; the rest is inferred).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import flax.errors
import jax
import numpy as np
from flax import linen as nn
from flax import nnx
from jax.extend import core as jcore

from converters import abstract_models
from converters.errors import ConversionError, PathMappingError, format_offenders
from converters.linen_model import LAYOUTS, LinenModel, accepts_layout
from converters.paths import PathMapping, PathRule, as_mapping, format_path
from converters.variable_types import CollectionTable

#: Operations that only reshape, cast, broadcast or place a value: a variable
#: flowing through them is still that variable, not yet used.
PASS_THROUGH = frozenset({
    'reshape', 'convert_element_type', 'broadcast_in_dim', 'squeeze', 'expand_dims',
    'copy', 'copy_p', 'sharding_constraint', 'mesh_cast', 'reshard', 'device_put',
    'optimization_barrier',
})
#: How many operations after its first use describe a variable's role.
CONTEXT_DEPTH = 3
#: Operations that give a computation its structure: contractions,
#: reductions, lookups and loops. Two implementations of one layer can differ
#: in the elementwise operations between them (where a scale is applied), not
#: in these.
MAJOR = frozenset({
    'dot_general', 'conv_general_dilated', 'reduce_sum', 'reduce_max', 'reduce_min',
    'reduce_prod', 'argmax', 'argmin', 'gather', 'scatter', 'scatter-add', 'dynamic_slice',
    'dynamic_update_slice', 'scan', 'while', 'cond', 'cumsum', 'sort',
})
#: How far to look for the nearest structural operation.
MAJOR_DEPTH = 8
#: Operations whose operands commute: `sigmoid(g) * v` and `v * sigmoid(g)`
#: use `v` the same way, so their operand positions say nothing.
COMMUTATIVE = frozenset({'add', 'add_any', 'mul', 'max', 'min', 'and', 'or', 'xor', 'eq', 'ne'})


def _operand(primitive: str, position: int) -> int:
  return 0 if primitive in COMMUTATIVE else position


@dataclasses.dataclass(frozen=True)
class Use:
  """Where the computation first consumes a variable."""

  primitive: str
  operand: int
  #: `(primitive, operand)` of the operations its result flows into next.
  context: tuple[tuple[str, int], ...] = ()
  #: For each other operand of that first use, the operations that made it
  #: (nearest first): what the variable is combined with.
  inputs: tuple[tuple[str, ...], ...] = ()
  #: The nearest structural operation (`MAJOR`) the result flows into, with
  #: the operand it enters as, and the nearest one that made each other
  #: operand: the role of the variable, whatever elementwise steps between.
  structure: tuple = ()

  @property
  def exact(self) -> tuple:
    return (self.primitive, _operand(self.primitive, self.operand), self.context, self.inputs)

  @property
  def structural(self) -> tuple:
    return (self.primitive, _operand(self.primitive, self.operand), self.structure)


@dataclasses.dataclass(frozen=True)
class Traced:
  """One variable of a traced model."""

  collection: str
  path: tuple
  shape: tuple[int, ...]
  dtype: str
  first: int | None  # order of first use; None when the computation never reads it
  use: Use | None
  scanned: bool = False  # stacked: a scan slices it over its layers
  #: One layer of a stacked variable, traced with its scan unrolled (its
  #: path is the stacked variable's, its shape one layer's).
  layer: int | None = None

  def signature(self, exact: bool) -> tuple:
    use = None if self.use is None else (self.use.exact if exact else self.use.structural)
    return (self.collection, self.shape, self.dtype, use)

  def describe(self) -> str:
    where = f'{self.use.primitive} operand {self.use.operand}' if self.use else 'never read'
    layer = '' if self.layer is None else f' layer {self.layer}'
    return f'{format_path(self.path)}{layer} ({self.collection}, {self.shape} {self.dtype}, {where})'


# -- tracing -----------------------------------------------------------------------


def _is_box(x) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def _abstract(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, 'shape') else x


def trace_linen(module: nn.Module, args, kwargs, rngs=None) -> tuple[jcore.ClosedJaxpr, list]:
  """The jaxpr of `module.apply(variables, *args, **kwargs)` over abstract
  variables, and `(collection, path)` of each of its inputs (None: not a variable)."""
  rngs = rngs if rngs is not None else {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  variables = jax.eval_shape(lambda r, a: module.init(r, *a, **kwargs), rngs, args)
  bare = jax.tree.map(lambda b: _abstract(b.value if _is_box(b) else b), variables, is_leaf=_is_box)
  leaves = jax.tree_util.tree_flatten_with_path(bare)[0]
  names = [(str(k[0].key), tuple(str(x.key) for x in k[1:])) for k, _ in leaves]

  def apply(v, a, mutable=False):
    return module.apply(v, *a, **kwargs, mutable=mutable)

  try:
    closed = jax.make_jaxpr(apply)(bare, args)
  except flax.errors.ModifyScopeVariableError:
    # A call that writes a collection (a decode cache, batch statistics in
    # training): traced anew, so no operation of the failed trace remains.
    closed = jax.make_jaxpr(functools.partial(apply, mutable=True))(bare, args)
  return closed, names + [None] * (len(closed.jaxpr.invars) - len(names))


def trace_nnx(model: nnx.Module, args, kwargs, table: CollectionTable) -> tuple[jcore.ClosedJaxpr, list]:
  """The jaxpr of `model(*args, **kwargs)` over its abstract state, and
  `(collection, path)` of each input (None: RNG state and the arguments)."""
  graphdef, state = nnx.split(model)
  flat = nnx.to_flat_state(state)
  names = []
  for path, variable in flat:
    if not isinstance(variable, nnx.Variable):
      names.append(None)  # an array attribute (a convolution's mask): a constant
      continue
    collection = table.collection(variable, format_path(path))
    names.append(None if collection is None else (collection, tuple(path)))
  abstract = jax.tree.map(_abstract, state)

  def call(s, a):
    return nnx.merge(graphdef, s)(*a, **kwargs)

  closed = jax.make_jaxpr(call)(abstract, args)
  return closed, names + [None] * (len(closed.jaxpr.invars) - len(names))


# -- where each variable is used ---------------------------------------------------


def _inner_jaxprs(eqn) -> list[tuple[jcore.Jaxpr, list]]:
  """`(jaxpr, outer operand of each of its inputs)` of an equation's sub-jaxprs."""
  found = []
  for value in eqn.params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jcore.ClosedJaxpr):
        found.append(item.jaxpr)
      elif isinstance(item, jcore.Jaxpr):
        found.append(item)
  out = []
  for jaxpr in found:
    n = len(jaxpr.invars)
    if eqn.primitive.name == 'while':  # [cond consts, body consts, carry]
      operands = list(eqn.invars[eqn.params['cond_nconsts']:])
      operands = operands[-n:] if len(operands) >= n else operands
    else:  # pjit, remat, custom_jvp/vjp, scan (consts, carry, xs): aligned at the end
      operands = list(eqn.invars[-n:]) if n <= len(eqn.invars) else list(eqn.invars)
    out.append((jaxpr, [None] * (n - len(operands)) + operands))
  return out


class _Walk:
  """Records, in program order, every use of a variable (through sub-jaxprs)."""

  def __init__(self, stacked: frozenset[int] = frozenset(), size: int = 0):
    self.first: dict[int, tuple[int, Use]] = {}
    self.counter = 0
    #: Variables a scan slices over (`xs`): layers stacked on axis 0.
    self.scanned: set[int] = set()
    #: With scans unrolled: the stacked variables, and `{(variable, layer):
    #: id}` of the layers sliced out of them (ids from `size` on).
    self.stacked = stacked
    self.layers: dict[tuple[int, int], int] = {}
    self.size = size

  def run(self, jaxpr: jcore.Jaxpr, ident: dict) -> None:
    consumers = defaultdict(list)
    producers = {}
    for index, eqn in enumerate(jaxpr.eqns):
      for position, var in enumerate(eqn.invars):
        if isinstance(var, jcore.Var):
          consumers[var].append((index, position))
      for var in eqn.outvars:
        producers[var] = eqn
    for index, eqn in enumerate(jaxpr.eqns):
      ids = [ident.get(v) if isinstance(v, jcore.Var) else None for v in eqn.invars]
      if not any(i is not None for i in ids):
        continue
      if eqn.primitive.name == 'scan':
        first_x = eqn.params['num_consts'] + eqn.params['num_carry']
        self.scanned.update(i for i in ids[first_x:] if i is not None)
      inner = _inner_jaxprs(eqn)
      if inner:
        outer = {id(v): i for v, i in zip(eqn.invars, ids) if isinstance(v, jcore.Var)}
        for sub, operands in inner:
          self.run(sub, {
              v: outer.get(id(o)) for v, o in zip(sub.invars, operands)
              if o is not None and outer.get(id(o)) is not None
          })
        continue
      if eqn.primitive.name in PASS_THROUGH and ids[0] is not None:
        ident[eqn.outvars[0]] = ids[0]
        continue
      if ids[0] in self.stacked and (layer := _layer_sliced(eqn)) is not None:
        key = (ids[0], layer)
        ident[eqn.outvars[0]] = self.layers.setdefault(key, self.size + len(self.layers))
        continue
      for position, variable in enumerate(ids):
        if variable is not None and variable not in self.first:
          others = [o for other, o in enumerate(eqn.invars) if other != position]
          name = eqn.primitive.name
          inputs = [_origin(producers, o, ident) for o in others]
          majors = [_origin(producers, o, ident, MAJOR_DEPTH, major=True) for o in others]
          if name in COMMUTATIVE:
            inputs, majors = sorted(inputs), sorted(majors)
          use = Use(
              name, position, _context(jaxpr, consumers, eqn),
              tuple(inputs), (_next_major(jaxpr, consumers, eqn), tuple(majors)),
          )
          self.first[variable] = (self.counter, use)
          self.counter += 1


def _layer_sliced(eqn) -> int | None:
  """The layer a `slice` takes whole out of axis 0 (how an unrolled scan
  reads its `xs`), or None."""
  if eqn.primitive.name != 'slice':
    return None
  start, limit = eqn.params['start_indices'], eqn.params['limit_indices']
  strides = eqn.params.get('strides')
  shape = eqn.invars[0].aval.shape
  whole = all(a == 0 for a in start[1:]) and tuple(limit[1:]) == tuple(shape[1:])
  if limit[0] - start[0] == 1 and whole and (strides is None or all(x == 1 for x in strides)):
    return int(start[0])
  return None


def _context(jaxpr, consumers, eqn) -> tuple[tuple[str, int], ...]:
  """`(primitive, operand)` of the next `CONTEXT_DEPTH` operations the result
  of `eqn` flows into (the first consumer at each step; pass-through skipped)."""
  chain = []
  var = eqn.outvars[0] if eqn.outvars else None
  while var is not None and len(chain) < CONTEXT_DEPTH:
    uses = consumers.get(var)
    if not uses:
      break
    index, position = uses[0]
    nxt = jaxpr.eqns[index]
    var = nxt.outvars[0] if nxt.outvars else None
    if nxt.primitive.name not in PASS_THROUGH:
      chain.append((nxt.primitive.name, _operand(nxt.primitive.name, position)))
  return tuple(chain)


def _next_major(jaxpr, consumers, eqn) -> tuple[str, int] | None:
  """`(primitive, operand)` of the nearest structural operation the result of
  `eqn` flows into (following first consumers), or None within `MAJOR_DEPTH`."""
  var = eqn.outvars[0] if eqn.outvars else None
  for _ in range(MAJOR_DEPTH):
    uses = consumers.get(var) if var is not None else None
    if not uses:
      return None
    index, position = uses[0]
    nxt = jaxpr.eqns[index]
    if nxt.primitive.name in MAJOR:
      return (nxt.primitive.name, _operand(nxt.primitive.name, position))
    var = nxt.outvars[0] if nxt.outvars else None
  return None


def _origin(producers, var, ident, depth=CONTEXT_DEPTH, major=False) -> tuple[str, ...]:
  """The operations that made `var`, nearest first, `depth` of them
  (following each one's first operand; pass-through skipped; with `major`,
  only the nearest structural one): `('variable',)` for another variable,
  `('input',)` for an argument or a constant."""
  chain: list[str] = []
  steps = 0
  while len(chain) < (1 if major else depth) and steps < depth:
    steps += 1
    if not isinstance(var, jcore.Var):
      chain.append('literal')
      break
    if var in ident:
      chain.append('variable')
      break
    eqn = producers.get(var)
    if eqn is None:
      chain.append('input')
      break
    if major and eqn.primitive.name in MAJOR:
      # Which of its operands are variables: x @ W is not x @ ones.
      kinds = ''.join('v' if isinstance(o, jcore.Var) and o in ident else '-' for o in eqn.invars)
      chain.append(f'{eqn.primitive.name}[{kinds}]')
    elif not major and eqn.primitive.name not in PASS_THROUGH:
      chain.append(eqn.primitive.name)
    var = _followed(eqn, producers, ident)
  return tuple(chain)


def _followed(eqn, producers, ident):
  """The operand an origin chain follows: the first, or for operands that
  commute the one made by the operation whose name comes first (whatever
  their order; a constant is a literal on one side and an input on the
  other, so computed operands come first)."""
  if not eqn.invars:
    return None
  if eqn.primitive.name not in COMMUTATIVE:
    return eqn.invars[0]

  def maker(v) -> str:
    if not isinstance(v, jcore.Var):
      return 'literal'
    if v in ident:
      return 'variable'
    made = producers.get(v)
    return 'input' if made is None else made.primitive.name

  return min(eqn.invars, key=lambda v: (maker(v) in ('literal', 'input', 'variable'), maker(v)))


def traced_variables(closed: jcore.ClosedJaxpr, names: list, stacked: frozenset = frozenset()) -> list[Traced]:
  """Every variable of a traced model, in the order the computation first uses it
  (those it never reads last, by path).

  `stacked`: `(collection, path)` of variables a scan slices over, in a
  trace with scans unrolled (`jax.disable_jit`): each layer sliced out of
  one is a variable of its own (`Traced.layer`), as in a looped model.
  """
  stacked_ids = frozenset(i for i, n in enumerate(names) if n is not None and n in stacked)
  walk = _Walk(stacked_ids, len(names))
  walk.run(closed.jaxpr, {v: i for i, (v, n) in enumerate(zip(closed.jaxpr.invars, names)) if n})
  layers = defaultdict(list)
  for (i, layer), ident in walk.layers.items():
    layers[i].append((layer, ident))
  out = []
  for i, (var, name) in enumerate(zip(closed.jaxpr.invars, names)):
    if name is None:
      continue
    aval = var.aval
    dtype = str(np.dtype(aval.dtype))
    if layers.get(i):
      for layer, ident in sorted(layers[i]):
        first, use = walk.first.get(ident, (None, None))
        out.append(Traced(name[0], name[1], tuple(aval.shape[1:]), dtype, first, use, True, layer))
      continue
    first, use = walk.first.get(i, (None, None))
    out.append(Traced(name[0], name[1], tuple(aval.shape), dtype, first, use, i in walk.scanned))
  return sorted(out, key=lambda t: (t.first is None, t.first or 0, format_path(t.path), t.layer or 0))


# -- matching ----------------------------------------------------------------------


def match(linen: list[Traced], nnx_vars: list[Traced]) -> tuple[list[tuple[Traced, Traced]], list[str]]:
  """Pairs of the same signature, in order of first use; `(pairs, problems)`.

  Variables of one signature pair up in the order the computations first use
  them (a port computes its layers in the original's order). Variables the
  computation never reads pair by path. What cannot be paired is a problem.
  """
  pairs = []
  left = ([v for v in linen if v.use is not None], [v for v in nnx_vars if v.use is not None])
  # First the exact operations around each first use; then, for what is left,
  # the structure around it (two implementations of one layer may apply a
  # scale or a cast at another step).
  problems = []
  for exact in (True, False):
    groups: dict[tuple, list[list[Traced]]] = defaultdict(lambda: [[], []])
    for side, variables in enumerate(left):
      for v in variables:
        groups[v.signature(exact)][side].append(v)
    left = ([], [])
    for ls, ns in groups.values():
      if not exact and min(len(ls), len(ns)) > 1 and _guessed(ls, ns):
        problems += _indistinct(ls, ns)
        continue
      pairs += zip(ls, ns)
      left[0].extend(ls[len(ns):])
      left[1].extend(ns[len(ls):])
    left = tuple(sorted(vs, key=lambda t: t.first) for vs in left)
  for side, (mine, theirs) in enumerate((left, left[::-1])):
    this, other = ('linen', 'nnx')[side], ('nnx', 'linen')[side]
    for v in mine:
      alike = list(dict.fromkeys(
          format_path(t.path) + ('' if t.layer is None else f' layer {t.layer}')
          for t in theirs if (t.collection, t.shape, t.dtype) == (v.collection, v.shape, v.dtype)
      ))
      candidates = f'; {other} candidates of its shape, used otherwise: {", ".join(alike)}' if alike else ''
      problems.append(f'{this} {v.describe()}: no {other.upper() if other == "nnx" else "Linen"} variable is used this way{candidates}')
  unused = [[v for v in vs if v.use is None] for vs in (linen, nnx_vars)]
  by_path = {format_path(v.path): v for v in unused[1]}
  for v in unused[0]:
    other = by_path.pop(format_path(v.path), None)
    if other is not None and (other.shape, other.dtype) == (v.shape, v.dtype):
      pairs.append((v, other))  # never read by either: only the name can pair them
    else:
      problems.append(f'linen {v.describe()}: the forward pass never reads it, and NNX has no variable of its path')
  for v in by_path.values():
    problems.append(f'nnx {v.describe()}: the forward pass never reads it, and Linen has no variable of its path')
  return sorted(pairs, key=lambda p: (p[0].first is None, p[0].first or 0)), problems


def _guessed(linen: list[Traced], nnx_vars: list[Traced]) -> bool:
  """Whether pairing variables of one structure by their order of use would
  be a guess: the exact operations tell them apart within a side (so they
  are not used alike), yet none matched across sides, and they are not one
  parameter of repeated layers (paths that differ only in indices, or the
  layers of one stacked variable), whose order of use is their layer order."""
  for side in (linen, nnx_vars):
    families = {re.sub(r'\d+', '#', format_path(v.path)) for v in side}
    if len(families) > 1 and len({v.signature(True) for v in side}) > 1:
      return True
  return False


def _indistinct(linen: list[Traced], nnx_vars: list[Traced]) -> list[str]:
  """Problems for variables that the structure of the computation cannot tell
  apart, and whose exact operations differ between the two models."""
  names = lambda vs: ', '.join(format_path(v.path) for v in vs)
  return [
      f'linen {names(linen)} and nnx {names(nnx_vars)} (used alike as far as the '
      'structure of the two computations shows, while their exact operations differ: '
      'only the order of use would pair them; give their rules, paths=[PathRule(...)] '
      'for each, and the rest is inferred)'
  ]


# -- folding repeated layers into templates ----------------------------------------

_INDEXED = re.compile(r'^(.*?)(0|[1-9]\d*)$')


def _indices(path: tuple) -> list[tuple[int, str, int]]:
  """`(position, prefix, index)` of every key that ends in a layer index."""
  out = []
  for position, key in enumerate(path):
    if isinstance(key, int):
      out.append((position, '', key))
    elif (m := _INDEXED.match(str(key))):
      out.append((position, m[1], int(m[2])))
  return out


def _template(path: tuple, position: int, prefix: str) -> str:
  keys = [str(k) for k in path]
  keys[position] = prefix + '{i}'
  return '/'.join(keys)


def fold(pairs: Iterable[tuple[tuple, tuple]]) -> list[PathRule]:
  """Rules for `(linen path, nnx path)` pairs, layers of a loop folded into `{i}`.

  A layer family is a pair of key positions (one per side) holding the same
  index: `Block_3` and `blocks/3`. A family counts when at least two indices
  share the rest of their paths; every pair that fits a counted family is
  written once as a template.
  """
  pairs = list(pairs)
  support: dict[tuple, set[int]] = defaultdict(set)
  for lp, np_ in pairs:
    for la, lprefix, li in _indices(lp):
      for na, nprefix, ni in _indices(np_):
        if li == ni:
          key = (_template(lp, la, lprefix), _template(np_, na, nprefix))
          support[key].add(li)
  families: dict[tuple, set[int]] = defaultdict(set)  # layer prefixes
  for (lt, nt), indices in support.items():
    if len(indices) >= 2:
      lprefix, nprefix = lt[:lt.index('{i}') + 3], nt[:nt.index('{i}') + 3]
      families[lprefix, nprefix] |= indices
  rules, seen = [], set()
  for lp, np_ in pairs:
    chosen = None
    for la, lprefix, li in _indices(lp):
      for na, nprefix, ni in _indices(np_):
        if li != ni:
          continue
        lt, nt = _template(lp, la, lprefix), _template(np_, na, nprefix)
        if (lt[:lt.index('{i}') + 3], nt[:nt.index('{i}') + 3]) in families:
          candidate = (len(support[lt, nt]), lt, nt)
          chosen = max(chosen, candidate) if chosen else candidate
    lt, nt = (chosen[1], chosen[2]) if chosen else (format_path(lp), format_path(np_))
    if (lt, nt) not in seen:
      seen.add((lt, nt))
      rules.append(PathRule(lt, nt))
  return rules


def merge_layouts(looped: PathMapping, stacked: PathMapping) -> PathMapping:
  """One mapping for both layouts: the rules inferred from the looped models
  with the stacked paths inferred from the scanned ones, as `PathRule(linen,
  nnx, linen_stacked, nnx_stacked)`.

  Within one framework a layer's parameter keeps its path below the layer
  (`Block_{i}/mlp/Dense_0/kernel`, stacked `ScanBlock_0/mlp/Dense_0/kernel`),
  so each `{i}` rule pairs with the one stacked rule whose paths end, on both
  sides, as its own do after the layer index. The rules outside the layers
  must be the same in both.

  Raises:
    PathMappingError: a layer rule with no stacked counterpart or several,
      or rules outside the layers that the two layouts disagree on.
  """
  layered = [r for r in looped.rules if r.layered]
  plain = [r for r in looped.rules if not r.layered]
  plain_keys = {(r.linen, r.nnx) for r in plain}
  candidates = [r for r in stacked.rules if (r.linen, r.nnx) not in plain_keys]

  def below_layer(template: str) -> str:
    return template.split('{i}', 1)[1].lstrip('/')

  rules, problems, used = [], [], set()
  for rule in layered:
    ends = (below_layer(rule.linen), below_layer(rule.nnx))
    found = [
        s for s in candidates
        if s.linen.endswith('/' + ends[0]) and s.nnx.endswith('/' + ends[1]) and id(s) not in used
    ]
    if len(found) != 1:
      problems.append(
          f'{rule.linen} <-> {rule.nnx}: {len(found)} stacked rules end as it does'
          + (f' ({", ".join(f"{s.linen} <-> {s.nnx}" for s in found)})' if found else '')
      )
      continue
    used.add(id(found[0]))
    rules.append(PathRule(rule.linen, rule.nnx, found[0].linen, found[0].nnx))
  leftover = [f'{s.linen} <-> {s.nnx}' for s in candidates if id(s) not in used]
  if leftover:
    problems.append(f'stacked rules with no looped counterpart: {", ".join(leftover)}')
  if problems:
    raise PathMappingError(
        'the looped and the scanned models do not have the same layers: '
        + format_offenders(problems),
        fix='make both layouts of each model from one configuration, or write the rules '
        'of the layers by hand (PathRule(linen, nnx, linen_stacked, nnx_stacked))',
    )
  return PathMapping(plain + rules)


# -- the mapping -------------------------------------------------------------------


def infer_paths(
    linen_module: nn.Module,
    nnx_model: nnx.Module,
    *example_args,
    linen_kwargs: Mapping[str, Any] | None = None,
    nnx_kwargs: Mapping[str, Any] | None = None,
    paths: PathMapping | Iterable[PathRule] | None = None,
    collections: Mapping[str, type] | None = None,
    **example_kwargs,
) -> PathMapping:
  """The Linen <-> NNX path mapping of a model and its port, from what they compute.

  Args:
    linen_module: the Linen module (not initialised: its variables are traced).
    nnx_model: its NNX port, real or abstract (`nnx.eval_shape`), in the mode
      to compare (`model.eval()` for dropout).
    example_args, example_kwargs: inputs of one forward pass, arrays or
      `jax.ShapeDtypeStruct`s, the same for both models.
    linen_kwargs, nnx_kwargs: keyword arguments for one side only (Linen's
      `train=False`, an NNX `decode=False`).
    paths: rules you already know (a fused or reshaped parameter); they take
      precedence, and the rest is inferred.
    collections: `{Linen collection: nnx.Variable subclass}` beyond `params`,
      `batch_stats` and `cache`.

  Call it under the mesh and rules the models are annotated for (`with
  jax.set_mesh(mesh), nn.logical_axis_rules(rules):`) when they need them.

  Returns:
    A `PathMapping` with one rule per variable, layers of a loop folded into
    `{i}` templates; print `mapping.to_python()` to keep it.

  Raises:
    PathMappingError: listing every variable of either side that has no
      counterpart computed the same way, with how to fix it.
  """
  table = CollectionTable(collections)
  given = as_mapping(paths) if paths is not None else None
  linen_args = ('Linen', trace_linen, linen_module, example_args, {**example_kwargs, **(linen_kwargs or {})})
  nnx_args = ('NNX', trace_nnx, nnx_model, example_args, {**example_kwargs, **(nnx_kwargs or {})}, table)
  linen_vars = traced_variables(*_traced(*linen_args))
  nnx_vars = traced_variables(*_traced(*nnx_args))
  stacked = [frozenset((v.collection, v.path) for v in vs if v.scanned) for vs in (linen_vars, nnx_vars)]
  if bool(stacked[0]) != bool(stacked[1]):
    # One model scans its layers, the other loops them: both traced again
    # with scans unrolled, each layer of a stacked variable is a variable.
    with jax.disable_jit():
      linen_vars = traced_variables(*_inlined(*_traced(*linen_args)), stacked[0])
      nnx_vars = traced_variables(*_inlined(*_traced(*nnx_args)), stacked[1])
  rules: list[PathRule] = []
  if given is not None:
    linen_vars = [v for v in linen_vars if not given.match_all('linen', v.path)]
    nnx_vars = [v for v in nnx_vars if not given.match_all('nnx', v.path)]
    rules += list(given.rules)
  pairs, problems = match(linen_vars, nnx_vars)
  layer_rules, layer_problems = _stacked_rules(
      [(a, b) for a, b in pairs if a.layer is not None or b.layer is not None]
  )
  problems += layer_problems
  if problems:
    raise PathMappingError(
        'the two models do not compute with the same variables: '
        + format_offenders(problems),
        [p.split(' (')[0] for p in problems],
        fix='a parameter the port reshaped, fused or dropped needs a rule of its own '
        "(paths=[PathRule('linen/path', 'nnx/path', transform=...)]); the rest is "
        'inferred. If the port computes differently, it is not the same model',
    )
  _check_collections(pairs)
  rules += fold((a.path, b.path) for a, b in pairs if a.layer is None and b.layer is None)
  return PathMapping(rules + layer_rules)


#: Call-like operations and the parameter holding the jaxpr they call.
_CALLS = {
    'pjit': 'jaxpr', 'jit': 'jaxpr', 'remat2': 'jaxpr', 'checkpoint': 'jaxpr',
    'custom_jvp_call': 'call_jaxpr', 'custom_vjp_call': 'call_jaxpr', 'closed_call': 'call_jaxpr',
}


def _inlined(closed: jcore.ClosedJaxpr, names: list) -> tuple[jcore.ClosedJaxpr, list]:
  """`closed` with every call (jit, remat, custom derivatives) inlined, its
  inputs in the same order: one model's layers under `nn.remat` inside a
  scan and another's looped plainly compute the same operations in a row."""

  def run(jaxpr: jcore.Jaxpr, consts, *args):
    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]
    for eqn in jaxpr.eqns:
      values = [read(v) for v in eqn.invars]
      called = eqn.params.get(_CALLS.get(eqn.primitive.name, ''))
      if called is not None:
        inner = called if isinstance(called, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(called, ())
        outs = run(inner.jaxpr, inner.consts, *values)
      else:
        outs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
        outs = outs if eqn.primitive.multiple_results else [outs]
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]

  avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
  flat = jax.make_jaxpr(lambda *a: run(closed.jaxpr, closed.consts, *a))(*avals)
  return flat, names


def _stacked_rules(pairs: list[tuple[Traced, Traced]]) -> tuple[list[PathRule], list[str]]:
  """Rules for the layers of stacked variables paired with looped ones: the
  stacked path on its side, the looped template on the other; `(rules, problems)`.

  Layer `l` of a stacked array must pair with layer `l` of one looped family
  (`Block_{i}/...` at `i = l`), for every layer."""
  layers: dict[tuple[str, tuple], dict[int, tuple]] = defaultdict(dict)
  for a, b in pairs:
    stacked, looped, side = (a, b, 'linen') if a.layer is not None else (b, a, 'nnx')
    if looped.layer is not None:  # both stacked: one layer each cannot say which layers
      layers[side, stacked.path][stacked.layer] = None
      continue
    layers[side, stacked.path][stacked.layer] = looped.path
  rules, problems = [], []
  for (side, path), looped in layers.items():
    template = _layer_template(looped)
    other = 'nnx' if side == 'linen' else 'linen'
    if template is None:
      shown = ', '.join(
          f'{i}: {"(stacked)" if p is None else format_path(p)}' for i, p in sorted(looped.items())
      )
      problems.append(
          f'{side} {format_path(path)} (stacked): its layers pair with {other} variables '
          f'that are not one family of layers in its order ({shown})'
      )
      continue
    if side == 'linen':
      rules.append(PathRule(None, template, linen_stacked=format_path(path)))
    else:
      rules.append(PathRule(template, None, nnx_stacked=format_path(path)))
  return rules, problems


def _layer_template(looped: dict[int, tuple | None]) -> str | None:
  """The `{i}` template naming `looped[i]` for every layer `i` (0, 1, ...),
  or None. With one layer, the outermost key holding its index."""
  if any(p is None for p in looped.values()) or sorted(looped) != list(range(len(looped))):
    return None
  candidates = None
  for index, path in looped.items():
    found = {
        _template(path, position, prefix)
        for position, prefix, i in _indices(path) if i == index
    }
    candidates = found if candidates is None else candidates & found
  if not candidates:
    return None
  if len(candidates) == 1:
    return candidates.pop()
  first = looped[0]
  for position, prefix, i in _indices(first):  # outermost first
    if i == 0 and (t := _template(first, position, prefix)) in candidates:
      return t
  return None


def _traced(which: str, trace, *args):
  try:
    return trace(*args)
  except ConversionError:
    raise
  except Exception as e:  # the user's model: any error of theirs
    text = str(e).strip().splitlines()
    raise PathMappingError(
        f'the {which} model: tracing its forward pass on the example inputs failed: '
        f'{type(e).__name__}: {text[0] if text else ""}',
        fix='give inputs the model takes, and the keyword arguments of one side only as '
        "linen_kwargs= / nnx_kwargs= (Linen's train=False); an NNX model runs as it is "
        'given (model.eval(), and any attribute its call needs set)',
    ) from e


def _check_collections(pairs) -> None:
  """One path mapping serves every collection, so a path cannot name two variables."""
  seen: dict[tuple, str] = {}
  for a, b in pairs:
    for key in (('linen', a.path), ('nnx', b.path)):
      if key in seen and seen[key] != a.collection:
        raise PathMappingError(
            f'{key[0]} path {format_path(key[1])} holds variables of two collections '
            f'({seen[key]} and {a.collection}); one path mapping serves every '
            'collection, so give them distinct paths',
            [format_path(key[1])],
        )
      seen[key] = a.collection


# -- paths='infer' of the conversions ------------------------------------------------


def infer_models(
    linen_model: LinenModel | Callable[..., LinenModel],
    nnx_model: nnx.Module | Callable[..., nnx.Module],
    *,
    paths: PathMapping | Iterable[PathRule] | None = None,
    collections: Mapping[str, type] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    rules: tuple | None = None,
) -> PathMapping:
  """The mapping `paths='infer'` stands for: `infer_paths` of a port given whole.

  Args:
    linen_model: a `LinenModel(module, *example_inputs)`, or a function
      returning one; its inputs are the NNX model's too.
    nnx_model: the NNX port (real or abstract; never modified: a copy of it
      is traced, in eval mode), or a function returning it (called under
      `nnx.eval_shape`: nothing is allocated).
    paths: rules you already know; they take precedence.
    collections: as in `infer_paths`.
    mesh, rules: the mesh and logical rules the models are annotated for
      (None: those in context).

  When both sides are functions with a `layout` parameter (`'loop'` or
  `'scan'`), both layouts are inferred and merged (`merge_layouts`): the
  mapping every scan <-> loop conversion needs. Otherwise each side maps in
  the layout of its model (`infer_paths`); a function with a `layout`
  parameter beside a model of one layout makes that model's layout.

  Raises:
    PathMappingError: as `infer_paths`, or a side that is not a model.
  """
  contexts = contextlib.ExitStack()
  with contexts:
    if mesh is not None:
      contexts.enter_context(jax.set_mesh(mesh))
    if rules is not None:
      contexts.enter_context(nn.logical_axis_rules(rules))
    infer = functools.partial(
        _infer_layout, linen_model, nnx_model, paths=paths, collections=collections
    )
    if accepts_layout(linen_model) and accepts_layout(nnx_model):
      return merge_layouts(infer('loop'), infer('scan'))
    if not (accepts_layout(linen_model) or accepts_layout(nnx_model)):
      return infer(None)
    found, failures = [], []
    for layout in LAYOUTS:
      try:
        found.append(infer(layout))
      except PathMappingError as e:
        failures.append(e)
    # The layout of the model given whole, if it maps: its rules keep both
    # sides' paths (a model of the other layout maps too, across layouts).
    whole = [m for m in found if all(r.linen is not None and r.nnx is not None for r in m.rules)]
    if whole or found:
      return (whole or found)[0]
    raise min(failures, key=lambda e: len(e.paths))


def _infer_layout(linen_model, nnx_model, layout, *, paths, collections) -> PathMapping:
  linen = _made(linen_model, layout, 'linen_model')
  if not isinstance(linen, LinenModel):
    raise PathMappingError(
        f'linen_model: got {type(linen).__name__}; give LinenModel(module, '
        '*example_inputs) (converters.LinenModel), or a function returning one: '
        'a Linen module alone has no inputs to trace it with'
    )
  if isinstance(nnx_model, nnx.Module):
    model = nnx.merge(*nnx.split(nnx_model))  # a copy to put in eval mode
  elif callable(nnx_model):
    model = abstract_models.eval_shape(lambda: _made(nnx_model, layout, 'nnx_model'))
  else:
    raise PathMappingError(
        f'nnx_model: got {type(nnx_model).__name__}; give the NNX model (real or '
        'from nnx.eval_shape) or a function returning it'
    )
  if not isinstance(model, nnx.Module):
    raise PathMappingError(
        f'nnx_model: its function returned {type(model).__name__}, not an nnx.Module'
    )
  model.eval()  # the computation without dropout, as Linen's example inputs ask
  return infer_paths(
      linen.module, model, *linen.args, linen_kwargs=linen.kwargs, paths=paths,
      collections=collections,
  )


def _made(factory, layout: str | None, what: str):
  """`factory(layout=layout)`, or `factory()`, or the model given as it is."""
  if isinstance(factory, (LinenModel, nn.Module, nnx.Module)) or not callable(factory):
    return factory
  try:
    return factory() if layout is None or not accepts_layout(factory) else factory(layout=layout)
  except ConversionError:
    raise
  except Exception as e:  # the user's factory: any error of theirs
    raise PathMappingError(
        f'{what}: calling {getattr(factory, "__qualname__", repr(factory))} failed: '
        f'{type(e).__name__}: {e}'.strip()
    ) from e
