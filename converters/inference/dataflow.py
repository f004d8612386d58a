"""The dataflow graph of a traced forward pass, in a form two ports share.

One node per value the computation makes that matters to its structure:
variables, example inputs, constants and the results of operations; edges
from each operand to its use, labelled with the operand's role. What two
correct ports of one model may write differently is removed or made alike
(`Graph.of`):

- calls are inlined (`jit`, `remat`, custom derivatives, `shard_map`), so a
  block under `nn.remat` is the same block;
- sharding constraints in any form, copies, casts, and operations that only
  reshape, transpose, broadcast or tile a value (`jnp.tile` beside
  `broadcast_to`, an `einsum` that orders its output otherwise) are the
  value itself; but a transpose is remembered up to the next contraction,
  whose operand's axes are read in the order of the value transposed (`x @
  k.T` with `k` stored `(out, in)` is not `x @ w` with `w` stored `(in,
  out)`), and a variable transposed and then reshaped, or used otherwise,
  is a node of its own (`('transposed', permutation)`);
- a product or quotient with a scalar constant is the value itself (a scale
  applied before or after a contraction);
- operands of operations that commute carry no position;
- a contraction (`dot_general`) is labelled by the role of each operand's
  axes (contracted, batch, free): `x @ W`, `jnp.dot`, `einsum` and
  `dot_general` of one contraction are alike, a kernel stored transposed is
  not;
- index arithmetic (integer and boolean values computed from inputs and
  integer variables alone: a gather's index normalisation, a padding mask,
  a decode mask from the cache index) is the one input or variable it comes
  from, or one node per set of them; values computed from constants alone
  are constants;
- loops (`scan`, `while`) and branches (`cond`) keep their bodies as
  subgraphs, entered and left through nodes labelled by their role (a loop's
  carry feeds itself back), so layers under `nn.scan` are one body.

With `stacked` (variables a scan slices over, traced with scans unrolled),
each layer sliced out of a stacked variable is a variable node of its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Hashable, Iterable

import numpy as np
from jax.extend import core as jcore
from jax.extend.core import primitives

from converters import compat
from converters.inference import jaxprs
from converters.inference.traces import Trace

#: Operations whose result is their first operand, as far as structure goes
#: (and those that only place their operands: `jaxprs.Placing`).
TRANSPARENT = frozenset({
    primitives.copy_p, primitives.convert_element_type_p, primitives.reshape_p, primitives.broadcast_in_dim_p, primitives.squeeze_p,
    primitives.reduce_precision_p, compat.PVARY_P, primitives.stop_gradient_p, primitives.transpose_p, compat.TILE_P,
})
#: Of those, the ones that keep every axis where it is.
AXIS_PRESERVING = frozenset({
    primitives.copy_p, primitives.convert_element_type_p, primitives.reduce_precision_p, compat.PVARY_P,
    primitives.stop_gradient_p,
})
#: Operations read from their operands as written, a transposed one unplained.
_READ_AS_WRITTEN = TRANSPARENT | {primitives.mul_p, primitives.div_p, primitives.dot_general_p}
#: Operations whose operands commute.
COMMUTATIVE = frozenset({
    primitives.add_p, primitives.add_jaxvals_p, primitives.mul_p, primitives.max_p, primitives.min_p,
    primitives.and_p, primitives.or_p, primitives.xor_p, primitives.eq_p, primitives.ne_p,
})
#: Parameters that say what an operation computes (the rest say how or on
#: which shapes, which two ports may write differently).
MEANINGFUL = {
    'integer_pow': ('y',),
    'conv_general_dilated': (
        'window_strides', 'padding', 'lhs_dilation', 'rhs_dilation', 'feature_group_count',
        'batch_group_count',
    ),
    'slice': ('start_indices', 'limit_indices', 'strides'),
    'concatenate': ('dimension',), 'stack': ('axis',),
    'cumsum': ('reverse',), 'cumprod': ('reverse',), 'cummax': ('reverse',),
    'argmax': ('axes',), 'argmin': ('axes',),
    'split': ('sizes', 'axis'),
    'iota': ('dimension',),
}
#: Reductions: labelled by how many axes they reduce.
REDUCTIONS = frozenset({
    'reduce_sum', 'reduce_max', 'reduce_min', 'reduce_prod', 'reduce_and', 'reduce_or',
})


@dataclasses.dataclass
class Graph:
  """A dataflow graph: `labels[n]` of each node, `edges` as `(source, label,
  target)`, the node of each variable (`(input index, layer or None)`), and
  each variable's shape and dtype (a layer's own for a layer)."""

  labels: list[Hashable] = dataclasses.field(default_factory=list)
  edges: list[tuple[int, Hashable, int]] = dataclasses.field(default_factory=list)
  variables: dict[tuple[int, int | None], int] = dataclasses.field(default_factory=dict)
  #: Nodes computed from constants alone, and from example inputs alone
  #: (`node -> frozenset of input nodes`).
  constant: set[int] = dataclasses.field(default_factory=set)
  #: Index-valued nodes (integers and booleans, and what they convert to):
  #: `node -> the inputs and integer variables they are computed from`.
  index_sources: dict[int, frozenset] = dataclasses.field(default_factory=dict)
  #: Inputs (by index) of variables a scan slices over: stacked layers.
  scanned: frozenset = frozenset()
  #: Whether the computation runs a loop (`scan` or `while`).
  loops: bool = False
  #: The equations each node was made for, innermost first: the equation,
  #: then the calls (`jit`, `remat`) it was inlined from; `()` for an input
  #: or an output. Where a refusal points in the model's source (`parting`).
  origins: list = dataclasses.field(default_factory=list, repr=False, compare=False)
  #: The equations being read while the graph is built.
  origin: tuple = dataclasses.field(default=(), repr=False, compare=False)
  #: `(label, operands) -> node` of the operations made so far (`node(shared=True)`).
  _computed: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

  def node(self, label: Hashable, *operands: tuple[int, Hashable], shared: bool = False) -> int:
    """A new node, or with `shared` the node of the same operation on the
    same operands if there is one: a value a port computes twice (a layer
    called again for its shape) is one value."""
    if shared:
      key = (label, tuple(sorted(operands, key=repr)))
      if key in self._computed:
        return self._computed[key]
    self.labels.append(label)
    self.origins.append(self.origin)
    n = len(self.labels) - 1
    for source, edge in operands:
      self.edges.append((source, edge, n))
    if shared:
      self._computed[key] = n
    return n

  @classmethod
  def of(cls, trace: Trace, stacked: Iterable[int] = (), relaxed: bool = False,
         any_axis_order: bool = False) -> Graph:
    """The graph of `trace`; `stacked`: inputs whose layers are variables;
    `relaxed`: the positions of the parts of a concatenation, of the cases
    of a selection and of the branches of a `cond` count for nothing (a port
    may stack or branch in another order and index accordingly);
    `any_axis_order`: a contraction's operands are alike whatever the order
    of their axes, and variables of one size whatever their shape (to find
    the partner of a kernel stored transposed or reshaped: the transform is
    then proven by the witness, never taken from this graph)."""
    return _Builder(trace, frozenset(stacked), relaxed, any_axis_order).graph


def _aval(v):
  return v.aval


def _shape(v) -> tuple[int, ...]:
  return tuple(getattr(_aval(v), 'shape', ()))


def _dtype(v) -> str:
  try:
    return str(np.dtype(_aval(v).dtype))
  except TypeError:  # a PRNG key's dtype
    return str(_aval(v).dtype)


def _is_index(v) -> bool:
  dtype = getattr(_aval(v), 'dtype', None)
  try:
    return np.issubdtype(np.dtype(dtype), np.integer) or np.dtype(dtype) == np.bool_
  except TypeError:
    return False


def _rows_taken(eqn, ins: list[int], constant: set[int]) -> int | None:
  """The table whose leading rows `eqn` takes at indices fixed by the
  program (`pos[:L]`, a `dynamic_slice` at a constant start, `take` or
  `Embed` of `arange(L)`): one form, whichever a port writes (which rows,
  the witness checks). None for any other operation."""
  primitive, params = eqn.primitive, eqn.params
  if not ins or ins[0] in constant:
    return None
  shape = _shape(eqn.invars[0])
  if primitive is primitives.slice_p:
    strides = params.get('strides') or (1,) * len(shape)
    whole = tuple(params['limit_indices'][1:]) == shape[1:] and not any(params['start_indices'][1:])
    return ins[0] if whole and all(s == 1 for s in strides) else None
  if primitive is primitives.dynamic_slice_p:
    whole = tuple(params['slice_sizes'][1:]) == shape[1:]
    return ins[0] if whole and all(n in constant for n in ins[1:]) else None
  if primitive is primitives.gather_p and len(ins) == 2 and ins[1] in constant:
    numbers = params['dimension_numbers']
    rows = (tuple(numbers.collapsed_slice_dims) == (0,) and tuple(numbers.start_index_map) == (0,)
            and tuple(params['slice_sizes'][1:]) == shape[1:])
    return ins[0] if rows else None
  return None


def _roles(shape: tuple[int, ...], contracting, batch) -> str:
  """The role of each axis of a contraction's operand, runs of one role as
  one and axes of size one left out: a kernel (E, H, D) contracted over E
  and its flat (E, H*D) form are alike, as are grouped-query attention's
  (B, L, H, 1, D) and (B, L, H, D); the same kernel stored transposed is not."""
  roles = ''.join(
      'c' if a in contracting else 'b' if a in batch else 'f'
      for a in range(len(shape)) if shape[a] != 1
  )
  return ''.join(r for k, r in enumerate(roles) if k == 0 or roles[k - 1] != r)


@dataclasses.dataclass(frozen=True)
class _Transposed:
  """A value that is `node` with its axes moved: its axis `j` is the node's
  axis `order[j]`."""

  node: int
  order: tuple[int, ...]


class _Builder:
  """Builds a `Graph` from a `Trace`, one jaxpr at a time."""

  def __init__(self, trace: Trace, stacked: frozenset[int], relaxed: bool = False,
               any_axis_order: bool = False):
    self.graph = g = Graph()
    self.relaxed = relaxed
    self.any_axis_order = any_axis_order
    self.stacked: dict[int, int] = {}  # node of a stacked variable -> its input index
    self.layers: dict[tuple[int, int], int] = {}
    self.indices: dict[frozenset, int] = {}
    self.scanned: set[int] = set()
    self.nodes_of: dict[int, int] = {}  # stacked input -> its node
    self.concatenated: dict[int, list[int]] = {}  # node of a stack along axis 0 -> operands
    self.transposed: dict[tuple, int] = {}  # (variable node, order) -> its node
    self.entered: set[int] = set()  # nodes of variables in a loop's body
    jaxpr = trace.closed.jaxpr
    args: list[int] = []
    n_vars = len(trace.variables)
    for k, var in enumerate(jaxpr.invars):
      if k >= n_vars:
        position = k - n_vars
        n = g.node(('input', position, _shape(var), _dtype(var)))
        g.index_sources[n] = frozenset({n})
      elif k in trace.constants:  # an array attribute of the port: a constant
        n = self._constant(trace.constants[k])
      elif trace.variables[k] is None:
        n = g.node(('state', _shape(var), _dtype(var)))
      else:
        collection = trace.variables[k][0]
        if k in stacked:  # its layers are the variables
          n = g.node(('stacked', collection, _shape(var), _dtype(var)))
          self.stacked[n] = k
          self.nodes_of[k] = n
        else:
          # in any axis order, a variable is known by its size: stored
          # transposed or reshaped (`(E, H, D)` as `(E, H*D)`), it is alike
          shape = (int(np.prod(_shape(var))),) if any_axis_order else _shape(var)
          n = g.node(('variable', collection, shape, _dtype(var)))
          g.variables[k, None] = n
          if _is_index(var):  # a counter, a cache index
            g.index_sources[n] = frozenset({n})
      args.append(n)
    outs = [self.plain(v) for v in self.run(trace.closed, args, ())]
    g.origin = ()
    g.scanned = frozenset(self.scanned)
    for k, n in enumerate(outs[:trace.outputs]):
      g.node(('output', k), (n, 'output'))
    for out, k in trace.updated:
      if trace.variables[k] is None:
        continue  # other state (RNG counts): what it becomes is no output
      value = outs[out]
      if (k, None) in g.variables:
        if value != g.variables[k, None]:
          g.node(('update',), (value, 'update'), (g.variables[k, None], 'updates'))
        continue
      # a stacked variable: its layers, written back one by one
      layers = self.concatenated.get(value, ())
      for layer, part in enumerate(layers):
        target = self._layer(k, layer, jaxpr.invars[k])
        if part != target:
          g.node(('update',), (part, 'update'), (target, 'updates'))

  # -- values --------------------------------------------------------------

  def _constant(self, value) -> int:
    label = ('constant', np.shape(value))
    array = np.asarray(value)
    if array.size > 1 and array.dtype.kind in 'iub':
      # an index array (`x[:, idx]`): which indices is the structure
      label += (hashlib.sha1(array.tobytes()).hexdigest()[:16],)
    n = self.graph.node(label)
    self.graph.constant.add(n)
    return n

  def _literal(self, value) -> int:
    n = self.graph.node(('constant', np.shape(value)))
    self.graph.constant.add(n)
    return n

  def plain(self, value: int | _Transposed) -> int:
    """The node of a value: a variable transposed is a node of its own
    (used other than by a contraction, its axes' order matters); any other
    value transposed is the value (an activation's axes may be ordered
    otherwise by a port)."""
    if not isinstance(value, _Transposed):
      return value
    g = self.graph
    if not self._holds_variable(value.node) or value.node in g.index_sources:
      return value.node  # an activation, or index arithmetic (one node whatever its form)
    key = (value.node, value.order)
    if key not in self.transposed:
      self.transposed[key] = g.node(('transposed', value.order), (value.node, 'transposed'))
    return self.transposed[key]

  def _holds_variable(self, n: int) -> bool:
    """Whether node `n` is a variable, or one entering a loop's body (a
    layer sliced from a stacked one, a weight the loop reads whole)."""
    return self.graph.labels[n][0] in ('variable', 'stacked') or n in self.entered

  # -- one jaxpr -----------------------------------------------------------

  def run(self, jaxpr: jcore.ClosedJaxpr, args: list, calls: tuple) -> list[int | _Transposed]:
    """The values of `jaxpr`'s outputs (a transposed one as `_Transposed`)
    for the nodes `args` of its inputs, inlined from `calls`."""
    rules = {jaxprs.Call: self._call, jaxprs.ShardMap: self._call, jaxprs.Placing: _placed,
             jaxprs.Scan: self._scan, jaxprs.While: self._while, jaxprs.Cond: self._cond}
    return jaxprs.interpret(jaxpr, args, self._equation, rules=rules, inline=(), literal=self._literal,
                            constant=self._constant, calls=calls, enter=self._enter)

  def _enter(self, eqn, calls: tuple) -> None:
    """What the nodes made next are made for: `eqn`, in `calls`."""
    self.graph.origin = (eqn, *calls)

  def _call(self, eqn, call: jaxprs.Call, values: list, calls: tuple) -> list:
    """A call inlined (a `shard_map` too: its body is the computation)."""
    return self.run(call.jaxpr, call.operands(values), (eqn, *calls))

  def _equation(self, eqn, kind, values: list, calls: tuple) -> list:
    """An operation on values."""
    g = self.graph
    if eqn.primitive in _READ_AS_WRITTEN:
      return [self._operation(eqn, values)]
    ins = [self.plain(v) for v in values]
    if eqn.primitive is compat.OPTIMIZATION_BARRIER_P:
      return ins
    outs = [self._operation(eqn, ins)]
    if len(eqn.outvars) > 1:
      outs = [g.node(('part', k), (outs[0], 'part'), shared=True) for k in range(len(eqn.outvars))]
    return outs

  def body(self, jaxpr: jcore.ClosedJaxpr, args: list, calls: tuple) -> list[int]:
    """The output nodes of a loop's body or a branch, for the nodes `args`
    of its inputs, inside `calls`."""
    return [self.plain(v) for v in self.run(jaxpr, args, calls)]

  def _operation(self, eqn, values: list) -> int | _Transposed:
    g = self.graph
    primitive, name = eqn.primitive, eqn.primitive.name
    if primitive is primitives.transpose_p:
      value = values[0]
      node, order = (value.node, value.order) if isinstance(value, _Transposed) else (value, None)
      order = order or tuple(range(len(eqn.params['permutation'])))
      order = tuple(order[a] for a in eqn.params['permutation'])
      return node if order == tuple(range(len(order))) else _Transposed(node, order)
    if primitive in AXIS_PRESERVING and values:
      return values[0]
    if primitive is primitives.dot_general_p:
      return self._contraction(eqn, values)
    if primitive in (primitives.mul_p, primitives.div_p) and len(values) == 2:
      scalar = [
          k for k, (v, n) in enumerate(zip(eqn.invars, values))
          if n in g.constant and int(np.prod(_shape(v))) == 1
      ]
      if primitive is primitives.mul_p and len(scalar) == 1:
        return values[1 - scalar[0]]
      if primitive is primitives.div_p and scalar == [1]:
        return values[0]
    ins = [self.plain(v) for v in values]
    if primitive in TRANSPARENT and ins:
      return ins[0]
    if ins and ins[0] in self.stacked and (layer := _layer_sliced(eqn)) is not None:
      return self._layer(self.stacked[ins[0]], layer, eqn.invars[0])
    if _along_axis_0(eqn):  # the layers of a stacked variable, stacked again?
      whole = self._restacked(ins)
      if whole is not None:
        return whole
    if all(n in g.constant for n in ins):  # `iota` too
      n = g.node(('constant', _shape(eqn.outvars[0])))
      g.constant.add(n)
      return n
    sources = [g.index_sources.get(n) for n in ins if n not in g.constant]
    if all(s is not None for s in sources) and all(_is_index(v) for v in eqn.outvars):
      # index arithmetic (`x[tokens]` normalises negative indices, `take`
      # too; a mask from a cache index): the one input or integer variable
      # it comes from, or one node per set of them
      union = frozenset().union(*sources)
      if len(union) == 1:
        return next(iter(union))
      if union not in self.indices:
        n = g.node(('index',), *((s, 'index') for s in sorted(union)))
        g.index_sources[n] = union
        self.indices[union] = n
      return self.indices[union]
    table = _rows_taken(eqn, ins, g.constant)
    if table is not None:
      return g.node(('rows',), (table, 'table'), shared=True)
    label: tuple = (name,)
    if name in REDUCTIONS:
      label += (len(eqn.params.get('axes', ())),)
    for key in MEANINGFUL.get(name, ()):
      value = eqn.params.get(key)
      label += (repr(value),)
    if primitive is primitives.conv_general_dilated_p:
      label += (repr(eqn.params['dimension_numbers']),)
    edges = ((n, self._position(primitive, k)) for k, n in enumerate(ins))
    n = g.node(label, *edges, shared=not eqn.effects)
    if _along_axis_0(eqn):
      self.concatenated[n] = list(ins)
    return n

  def _contraction(self, eqn, values: list) -> int:
    """A `dot_general`, each operand's axes read in the order of the value
    it transposes (if it does)."""
    g = self.graph
    (contract_l, contract_r), (batch_l, batch_r) = eqn.params['dimension_numbers']
    label = ('dot_general',)  # how many axes of each role: the roles' runs say it, whatever the shape
    nodes, roles = [], []
    for value, var, contracting, batch in zip(values, eqn.invars, (contract_l, contract_r), (batch_l, batch_r)):
      shape = _shape(var)
      if isinstance(value, _Transposed):  # axis j of the operand is axis order[j] of the value
        own = [0] * len(shape)
        for j, a in enumerate(value.order):
          own[a] = shape[j]
        shape = tuple(own)
        contracting = [value.order[j] for j in contracting]
        batch = [value.order[j] for j in batch]
        value = value.node
      nodes.append(self.plain(value))
      roles.append(_roles(shape, contracting, batch))
    sides = ['lhs', 'rhs']
    if self.any_axis_order:  # and either operand first: the output's axes move too
      roles, sides = [''.join(sorted(set(r))) for r in roles], ['operand', 'operand']
    return g.node(label, (nodes[0], (sides[0], roles[0])), (nodes[1], (sides[1], roles[1])), shared=True)

  def _layer(self, k: int, layer: int, stacked_var) -> int:
    """The node of layer `layer` of stacked input `k`."""
    g = self.graph
    if (k, layer) not in self.layers:
      label = g.labels[g_node] if (g_node := self.nodes_of.get(k)) is not None else None
      n = g.node(('variable', label[1], _shape(stacked_var)[1:], _dtype(stacked_var)))
      self.layers[k, layer] = g.variables[k, layer] = n
    return self.layers[k, layer]

  def _restacked(self, ins: list[int]) -> int | None:
    """The stacked variable whose layers `ins` are, in order, or None."""
    found = [key for key, n in self.layers.items() if n in ins]
    keys = {k for k, _ in found}
    if len(keys) == 1 and [self.layers.get((k, l)) for k in keys for l in range(len(ins))] == ins:
      return self.nodes_of[keys.pop()]
    return None

  def _position(self, primitive, k: int):
    """The label of operand `k` of an operation's edge."""
    if primitive in COMMUTATIVE or (self.relaxed and primitive in (primitives.concatenate_p, compat.STACK_P)):
      return 'operand'
    if self.relaxed and primitive is primitives.select_n_p and k > 0:
      return 'case'
    return k

  # -- loops and branches ----------------------------------------------------

  def _scan(self, eqn, scan: jaxprs.Scan, values: list, calls: tuple) -> list[int]:
    g = self.graph
    g.loops = True
    ins = [self.plain(v) for v in values]
    n_consts, n_carry = scan.n_consts, scan.n_carry
    label = ('scan', scan.length, scan.reverse)
    entering, carries = [], []
    for k, n in enumerate(ins):
      if k < n_consts:
        node = g.node(label + ('const',), (n, 'enters'))
      elif k < n_consts + n_carry:
        node = g.node(label + ('carry',), (n, 'initial'))
        carries.append(node)
      else:
        node = g.node(label + ('slice',), (n, 'sliced'))
        self.scanned.update(k for (k, layer), m in g.variables.items() if m == n and layer is None)
      if (k >= n_consts + n_carry or k < n_consts) and self._holds_variable(n):
        self.entered.add(node)
      entering.append(node)
    outs = self.body(scan.body, entering, calls)
    g.origin = (eqn, *calls)  # (its results are the scan's, not its body's last operation's)
    # A carry the body returns in its place, or a scanned operand it returns
    # as it is (an NNX scan gives back the state it was given), is its
    # operand: no node, so a port whose scan returns its state is alike.
    results = []
    for j, out in enumerate(outs):
      if j < n_carry:
        if out == carries[j]:
          results.append(ins[n_consts + j])
          continue
        g.edges.append((out, 'next', carries[j]))
        results.append(g.node(label + ('final',), (carries[j], 'final')))
      elif out in entering[n_consts + n_carry:]:
        results.append(ins[entering.index(out, n_consts + n_carry)])
      else:
        results.append(g.node(label + ('stacked',), (out, 'stacked')))
    return results

  def _while(self, eqn, loop: jaxprs.While, values: list, calls: tuple) -> list[int]:
    g = self.graph
    g.loops = True
    ins = [self.plain(v) for v in values]
    cond_consts, body_consts, init = loop.split(ins)
    carries = [g.node(('while', 'carry'), (n, 'initial')) for n in init]
    (predicate,) = self.body(
        loop.cond, [g.node(('while', 'const'), (n, 'enters')) for n in cond_consts] + carries, calls)
    g.origin = (eqn, *calls)
    entering = [g.node(('while', 'const'), (n, 'enters')) for n in body_consts]
    self.entered.update(m for n, m in zip(body_consts, entering) if self._holds_variable(n))
    for carry, out in zip(carries, self.body(loop.body, entering + carries, calls)):
      g.edges.append((out, 'next', carry))
    g.origin = (eqn, *calls)
    return [g.node(('while', 'final'), (c, 'final'), (predicate, 'until')) for c in carries]

  def _cond(self, eqn, cond: jaxprs.Cond, values: list, calls: tuple) -> list[int]:
    g = self.graph
    index, operands = cond.split([self.plain(v) for v in values])
    branches = [self.body(branch, operands, calls) for branch in cond.branches]
    g.origin = (eqn, *calls)  # (its results are the `cond`'s, not its last branch's)
    return [
        g.node(('cond', len(branches)), (index, 'index'), *(
            (b[k], 'branch' if self.relaxed else ('branch', i)) for i, b in enumerate(branches)
        ))
        for k in range(len(eqn.outvars))
    ]


def _placed(eqn, kind, values: list, calls: tuple) -> list:
  """An operation that only places its operands (one or several): each
  result is its operand, a transposed one as it was."""
  return values[:len(eqn.outvars)]


def _along_axis_0(eqn) -> bool:
  """Whether `eqn` stacks or concatenates its operands along axis 0 (how
  an unrolled scan stacks its results)."""
  return (eqn.primitive is primitives.concatenate_p and eqn.params['dimension'] == 0) or (
      eqn.primitive is compat.STACK_P and eqn.params['axis'] == 0)


def _layer_sliced(eqn) -> int | None:
  """The layer a `slice` takes whole out of axis 0 (how an unrolled scan
  reads its `xs`), or None."""
  if eqn.primitive is not primitives.slice_p:
    return None
  start, limit = eqn.params['start_indices'], eqn.params['limit_indices']
  strides = eqn.params.get('strides')
  shape = eqn.invars[0].aval.shape
  whole = all(a == 0 for a in start[1:]) and tuple(limit[1:]) == tuple(shape[1:])
  if limit[0] - start[0] == 1 and whole and (strides is None or all(x == 1 for x in strides)):
    return int(start[0])
  return None
