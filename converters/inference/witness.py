"""The numerical witness: an inferred mapping is checked by running both models.

Both traced forward passes run on the example inputs (and on them made
generic, when given as arrays: a symmetric input hides a transposed one,
constant tokens a query from a key; `generic_inputs`) with every variable
drawn at random, independently of every other (a counter hash of its own
seed: nothing to store, nothing shared between two variables), the NNX
model's converted from the Linen model's through the mapping under test.
A wrong pair changes the outputs at the scale of the values themselves, so
the outputs must agree: bit for bit when both compute alike, else within
`TOLERANCE` of the scale of the elements that differ (the two programs may
order floating point operations differently: a scale applied one step
later, a sum reassociated; an element equal on both sides, a mask's -1e9,
sets no scale). New values of variables the call writes (a decode cache,
batch statistics) are compared too.

The programs run operation by operation (`evaluation`), on one device
outside any mesh and without their sharding constraints, each variable
drawn when first read (a scanned one, layer by layer) and let go after its
last use: the witness holds about one layer's variables at a time, never the
model, and costs one forward pass of each model on the example inputs.
Which variables reach an output (`Witness.idle`: the gradient of a random
projection of the Linen model's outputs) is asked only for groups the
structure could not split.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun

from converters.errors import ConversionError, PathMappingError
from converters.inference.evaluation import Program, evaluate, outside_any_mesh
from converters.inference.traces import Trace
from converters.transforms import Rearrange, Step

#: Largest difference, relative to the outputs' scale, accepted between two
#: programs that compute alike in another order, by output dtype width.
TOLERANCE = {8: 1e-9, 4: 1e-4, 2: 3e-2}
#: Smallest first-order effect of a variable on the outputs, relative to
#: their scale, that a run can see: ten times float32's tolerance.
REACH = 1e-3
#: How many times `Witness.symmetric` draws the inputs' selectors anew.
SELECTOR_DRAWS = 2


@dataclasses.dataclass(frozen=True)
class Fused:
  """An NNX variable made by a given rule's transform from Linen variables."""

  sources: tuple[Hashable, ...]
  transform: Rearrange
  part: int
  parts: int
  lead: int


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What the witness found: `agree`, `exact` (bit for bit), and the
  largest relative difference and where."""

  agree: bool
  exact: bool
  difference: float
  where: str


@functools.partial(jax.jit, static_argnums=(1, 2))
def _hash_uniform(seed, shape, dtype, offset=0):
  """Values in [-1, 1) from a counter hash of `seed` and each element's index
  (counted from `offset`: a slice of a larger draw is drawn alone); one
  program per shape and dtype, not one per operation (integer arithmetic and
  exact float steps: the same bits either way)."""
  size = math.prod(shape)
  i = jax.lax.iota(jnp.uint32, max(size, 1))[:size] + jnp.asarray(offset, jnp.uint32)
  x = i * jnp.uint32(0x9E3779B1) + jnp.asarray(seed, jnp.uint32) * jnp.uint32(0x85EBCA77)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x2C1B3C6D)
  x = x ^ (x >> 12)
  x = x * jnp.uint32(0x297A2D39)
  x = x ^ (x >> 15)
  u = (x >> 8).astype(jnp.float32) * (2.0 / (1 << 24)) - 1.0
  return u.reshape(shape).astype(dtype)


def draw(seed, shape: tuple[int, ...], dtype, layer=None) -> jax.Array:
  """A variable's witness value: a kernel at unit variance of its fan-in
  (`shape[:-1]`), a vector around one (a scale, a bias or a variance: never
  zero, never negative), integers and booleans in {0, 1} (indices valid for
  any table, counters and cache indices that still differ). `layer`: only
  `draw(seed, shape, dtype)[layer]`, drawn alone."""
  dtype = jnp.dtype(dtype)
  part = shape if layer is None else shape[1:]
  offset = 0 if layer is None else layer * math.prod(part)
  u = _hash_uniform(seed, part, jnp.float32, offset)
  if not jnp.issubdtype(dtype, jnp.inexact):
    return (u > 0).astype(dtype)
  if len(shape) >= 2:
    value = u * math.sqrt(3.0 / max(math.prod(shape[:-1]), 1))
  else:
    value = 1.0 + 0.25 * u
  return value.astype(dtype)


_draw = jax.jit(draw, static_argnums=(1, 2))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _draw_layers(seeds, shape, dtype):
  """`draw(seed, shape, dtype)` of each of `seeds`, stacked: one program."""
  return jax.vmap(lambda seed: draw(seed, shape, dtype))(seeds)


@jax.jit
def _scaled_generic(x, seed):
  """Float `x` scaled to unit size, each element by its own factor in [0.5, 1.5)."""
  u = _hash_uniform(seed, tuple(x.shape), jnp.float32)
  size = jnp.max(jnp.abs(x)).astype(jnp.float32)
  unit = x.astype(jnp.float32) / jnp.where(size > 0, size, 1.0)
  return (unit * (1.0 + 0.5 * u)).astype(x.dtype)


@jax.jit
def _bounds(x):
  return jnp.min(x), jnp.max(x)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _drawn_between(seed, shape, dtype, low, high, count):
  """Integers of `shape` drawn between `low` and `high` (`count` values)."""
  u = _hash_uniform(seed, shape, jnp.float32)
  drawn = low + jnp.floor((u + 1.0) / 2.0 * count).astype(jnp.int32)
  return jnp.clip(drawn, low, high).astype(dtype)


def generic_inputs(inputs: Sequence, seed: int = 20_011) -> list | None:
  """The inputs made generic: float arrays scaled to unit size and each
  element by its own random factor in [0.5, 1.5) (signs and zeros kept: a
  mask stays a mask; a symmetric matrix or equal rows no longer are, and a
  large input no longer drowns a layer's share of the outputs below the
  tolerance); integer arrays drawn anew between their smallest and largest
  value (between 0 and 1 when constant: constant tokens make a query and a
  key alike); integer scalars and one-element integer arrays (a length, a
  step) and booleans kept. None
  when nothing changes."""
  out, changed = [], False
  for k, x in enumerate(inputs):
    scalar_index = x.size < 2 and not jnp.issubdtype(x.dtype, jnp.inexact)
    if not x.size or x.dtype == jnp.bool_ or scalar_index:
      out.append(x)
      continue
    if jnp.issubdtype(x.dtype, jnp.inexact):
      out.append(_scaled_generic(x, seed + k))
      changed = True
    elif jnp.issubdtype(x.dtype, jnp.integer):
      low, high = (int(v) for v in jax.device_get(_bounds(x)))
      if low == high and low >= 0:
        low, high = 0, max(high, 1)
      if low == high:
        out.append(x)
        continue
      out.append(_drawn_between(seed + k, tuple(x.shape), x.dtype, low, high, float(high - low + 1)))
      changed = True
    else:
      out.append(x)
  return out if changed else None


def selector_inputs(inputs: Sequence, draw: int) -> list:
  """The inputs with what may select a branch drawn anew (draw number
  `draw`): booleans both ways (an array drawn at random, a scalar negated
  on even draws), integer scalars and one-element integer arrays (a route,
  a length, a label) drawn between 0 and their value (1 for 0), other than
  it; integer arrays drawn anew between their smallest and largest value
  and floats scaled elementwise, as `generic_inputs` does, other seeds."""
  out = []
  for k, x in enumerate(inputs):
    seed = 30_011 + 977 * draw + k
    if not x.size:
      out.append(x)
    elif x.dtype == jnp.bool_:
      if x.size < 2:
        out.append(jnp.logical_xor(x, draw % 2 == 0))
      else:
        out.append(_hash_uniform(seed, tuple(x.shape), jnp.float32) > 0)
    elif jnp.issubdtype(x.dtype, jnp.integer) and x.size < 2:
      value = int(jnp.ravel(x)[0])
      high = max(value, 1)  # below it: a label or a position within the model's range
      count = high if 0 <= value <= high else high + 1  # the values in [0, high] but `value`
      pick = min(int((float(_hash_uniform(seed, (), jnp.float32)) + 1.0) / 2.0 * count), count - 1)
      drawn = pick if not 0 <= value <= pick else pick + 1
      out.append(jnp.full(x.shape, drawn, x.dtype))
    else:
      drawn = generic_inputs([x], seed)
      out.append(x if drawn is None else drawn[0])
  return out


def example_inputs(avals: Sequence, given: Sequence) -> list:
  """The given arrays, or for an abstract input values of its shape:
  integers in {0, 1} (indices valid for any table), booleans, or floats."""
  out = []
  for k, (aval, value) in enumerate(zip(avals, given)):
    if not isinstance(value, jax.ShapeDtypeStruct) and hasattr(value, 'shape'):
      out.append(_on_one_device(value))
      continue
    dtype = jnp.dtype(aval.dtype)
    u = _hash_uniform(10_007 + k, tuple(aval.shape), jnp.float32)
    if dtype == jnp.bool_:
      out.append(u > 0)
    elif jnp.issubdtype(dtype, jnp.integer):
      out.append((u > 0).astype(dtype))
    else:
      out.append(u.astype(dtype))
  return out


class Witness:
  """`check(copies)` runs both traces with each NNX slot drawn as its Linen
  partner; `idle()` tells which Linen slots reach no output.

  Args:
    linen, nnx: the traces (the inputs of both are the same example inputs).
    inputs: the example inputs' leaves (arrays or `ShapeDtypeStruct`s).
    slots: Linen slots (`(input index, layer or None)`) in seed order.
    nnx_slots: the NNX slots the pairs under test draw.
    fused: `{nnx input index: Fused}` for given rules with a transform.
    training: the traces of both models in training (`traces`'s
      `training=True`), made when `symmetric` first needs them; None: the
      models have no other mode to run.
  """

  def __init__(
      self, linen: Trace, nnx: Trace, inputs: Sequence, slots: Sequence[Hashable], *,
      nnx_slots: Sequence[Hashable], fused: Mapping[int, Fused],
      training: Callable[[], tuple[Trace, Trace]] | None = None,
  ):
    self.linen, self.nnx = linen, nnx
    self._training = training
    self.slots = list(slots)
    self.index = {s: k for k, s in enumerate(self.slots)}
    self.nnx_slots = list(nnx_slots)
    self.fused = dict(fused)
    self.linen_keys = _by_input(self.slots)
    self.nnx_keys = _by_input(self.nnx_slots)
    avals = [v.aval for v in linen.closed.jaxpr.invars[len(linen.variables):]]
    with outside_any_mesh():
      self.inputs = example_inputs(avals, inputs)
      # Inputs given as arrays may hide a wrong pair (a symmetric matrix,
      # where `x.T @ k` is `x @ k`; constant tokens): run on them made generic too.
      given = any(not isinstance(v, jax.ShapeDtypeStruct) and hasattr(v, 'shape') for v in inputs)
      self.generic = generic_inputs(self.inputs) if given else None
    self.programs = (Program.of(linen.closed), Program.of(nnx.closed))  # for every run
    self._gradients = {}

  def _mode(self, mode: str):
    """`((linen trace, nnx trace), (their programs))` of `mode`."""
    return ((self.linen, self.nnx), self.programs) if mode == 'eval' else self._training_runs

  @functools.cached_property
  def _training_runs(self):
    """`((linen, nnx traces in training), (their programs))`, or None where
    a model cannot be traced in training (a flag of its own) or holds other
    variables there (the slots are the eval traces' inputs, in order)."""
    try:
      traces = self._training()
    except PathMappingError:
      return None
    if all(t.variables == e.variables and t.inputs == e.inputs
           for t, e in zip(traces, (self.linen, self.nnx))):
      return traces, tuple(Program.of(t.closed) for t in traces)
    return None

  # -- values --------------------------------------------------------------

  def _linen_values(self) -> list:
    return [
        _drawn(var.aval, self.linen_keys.get(k, ()), lambda slot: self.index[slot] + 1)
        for k, var in enumerate(self.linen.closed.jaxpr.invars[:len(self.linen.variables)])
    ]

  # -- runs ----------------------------------------------------------------

  def _linen_input(self, k, layer=None):
    """Linen input `k` (a variable, or other state) as the witness draws it."""
    seed = lambda slot: self.index[slot] + 1
    return _drawn(self.linen.closed.jaxpr.invars[k].aval, self.linen_keys.get(k, ()), seed, layer)

  def _nnx_input(self, copies, k, layer=None):
    """NNX input `k` drawn as its Linen partner in `copies` (or made from
    its sources by a given rule's transform, or the port's own constant)."""
    nnx_vars = self.nnx.closed.jaxpr.invars
    if k in self.nnx.constants:
      value = _on_one_device(self.nnx.constants[k])
    elif k in self.fused:
      f = self.fused[k]
      sources = [self._linen_input(*s) for s in f.sources]
      try:
        value = _jitted(Step(f.transform, 'linen', f.lead, f.part, f.parts))(sources)
      except ConversionError as e:
        raise PathMappingError(f'{f.transform!r} does not apply to what it pairs: {e}') from e
      wanted = tuple(nnx_vars[k].aval.shape)
      if layer is not None and len(value.shape) == len(wanted) - 1:
        return _shaped(f.transform, value, wanted[1:])  # made one layer at a time
      value = _shaped(f.transform, value, wanted)
    else:
      partner = lambda slot: self.index[copies[slot]] + 1
      return _drawn(nnx_vars[k].aval, self.nnx_keys.get(k, ()), partner, layer)
    return value if layer is None else value[layer]

  def _run(self, copies, inputs, mode: str = 'eval', nan_equal: bool = False) -> list:
    """`(name, width, stats)` of each output and each variable both calls
    write on `inputs` (in `mode`: 'eval', or 'training' with the traces
    in training), stats `()` where shapes or dtypes differ."""
    linen_input = self._linen_input
    nnx_input = functools.partial(self._nnx_input, copies)
    (linen, nnx), programs = self._mode(mode)
    n = linen.outputs
    if n != nnx.outputs:
      return [(f'the models return {n} and {nnx.outputs} arrays', 0, ())]
    with outside_any_mesh():
      a = evaluate(programs[0], len(linen.variables), linen_input, inputs, n)
      b = evaluate(programs[1], len(nnx.variables), nnx_input, inputs, n)
      compared = [
          (f'output {k} {tuple(x.shape)}', jnp.dtype(x.dtype).itemsize,
           jax.device_get(_difference(x, y, nan_equal)) if _alike(x, y) else ())
          for k, (x, y) in enumerate(zip(a[:n], b[:n]))
      ]
      # New values of variables both write (None: written as it was read).
      linen_written = {k: out for out, k in linen.updated}
      nnx_written = {k: out for out, k in nnx.updated}
      for slot in self.nnx_slots:
        theirs = copies[slot]
        if slot[0] not in nnx_written or theirs[0] not in linen_written:
          continue
        x, y = a[linen_written[theirs[0]]], b[nnx_written[slot[0]]]
        if x is None and y is None:
          continue
        x = linen_input(*theirs) if x is None else _layer(x, theirs[1])
        y = nnx_input(*slot) if y is None else _layer(y, slot[1])
        name = f'the new value of a variable the call writes {tuple(x.shape)}'
        compared.append((name, jnp.dtype(x.dtype).itemsize,
                         jax.device_get(_difference(x, y, nan_equal)) if _alike(x, y) else ()))
    return compared

  def _influence(self, inputs):
    """Each Linen slot's first-order effect on a random projection of the
    outputs (the sum of |gradient x value| over its elements), relative to
    the projection's own scale (the sum of |output x weight|)."""
    linen_values = self._linen_values()
    floats = [k for k, v in enumerate(linen_values) if jnp.issubdtype(v.dtype, jnp.floating)]
    written = frozenset(out for out, _ in self.linen.updated)
    grads, scale = _influence_of(self.linen.closed, self.linen.outputs, written, tuple(floats))(
        linen_values, inputs)
    scale = np.maximum(np.float32(jax.device_get(scale)), np.float32(1e-30))
    reach = {}
    for k, g in zip(floats, grads):
      slots = self.linen_keys.get(k, ())
      if slots:
        whole, by_layer = jax.device_get(_effect(g, linen_values[k]))
        for slot in slots:
          reach[slot] = (whole if slot[1] is None else by_layer[slot[1]]) / scale
    return reach

  def _gradient(self, side: str) -> Callable:
    """`(values, inputs) -> {input index: gradient}` of one side's program:
    the gradient of a random projection of its outputs (the same weights on
    both sides) with respect to each floating input variable (compiled once)."""
    if side not in self._gradients:
      trace = self.linen if side == 'linen' else self.nnx
      run = jaxpr_as_fun(trace.closed)

      def gradients(values, inputs):
        floats = [k for k, v in enumerate(values) if jnp.issubdtype(v.dtype, jnp.floating)]

        def projection(chosen):
          given = list(values)
          for k, v in zip(floats, chosen):
            given[k] = v
          return _projection(run(*given, *inputs), lambda k: k < trace.outputs)[0]

        return dict(zip(floats, jax.grad(projection)([values[k] for k in floats])))

      self._gradients[side] = jax.jit(gradients)
    return self._gradients[side]

  def _compare_gradients(self, copies, inputs) -> list | None:
    """`(name, width, stats)` of the gradient of each NNX variable drawn as
    a Linen one against that one's (a variable a given rule's transform
    makes is left out: its gradient is another array); None where either
    program cannot be differentiated (a `while_loop`)."""
    with outside_any_mesh():
      linen = [self._linen_input(k) for k in range(len(self.linen.variables))]
      nnx = [self._nnx_input(copies, k) for k in range(len(self.nnx.variables))]
      try:
        a, b = self._gradient('linen')(linen, inputs), self._gradient('nnx')(nnx, inputs)
      except Exception:  # JAX's refusal to differentiate a program: no run backward
        return None
      compared = []
      for slot in self.nnx_slots:
        theirs = copies[slot]
        if slot[0] in self.fused or slot[0] not in b or theirs[0] not in a:
          continue
        x, y = _layer(a[theirs[0]], theirs[1]), _layer(b[slot[0]], slot[1])
        compared.append((f'the gradient of a variable {tuple(x.shape)}', jnp.dtype(x.dtype).itemsize,
                         jax.device_get(_difference(x, y, nan_equal=True)) if _alike(x, y) else ()))
    return compared

  @functools.cached_property
  def selector_draws(self) -> list[list]:
    """`SELECTOR_DRAWS` sets of inputs with what may select a branch drawn
    anew (`selector_inputs`)."""
    with outside_any_mesh():
      return [selector_inputs(self.inputs, d) for d in range(SELECTOR_DRAWS)]

  # -- public --------------------------------------------------------------

  def symmetric(self, copies: Mapping[Hashable, Hashable]) -> tuple[Verdict, Verdict | None]:
    """Both models through `copies` wherever an assignment that agrees at
    the example may still be wrong. First, what both compute: on the
    inputs with their selectors drawn anew (booleans both ways, integer
    scalars; `selector_draws`) and backward (the gradients: a custom
    derivative on one branch is seen; left out where a program cannot be
    differentiated). Second, in training (Flax's layers in training on both
    sides, the n-th random key of the call drawn alike: dropout on another
    weight is seen), or None where the models cannot be traced so. A run
    in training rests on a convention (the order of draws), not only on
    what the models compute: it may refuse an assignment, never choose one.
    Elements that are NaN on both sides agree: a draw that overflows
    decides nothing. Each verdict is the worst of its runs."""
    verdicts = [
        self._verdict(self._run(copies, inputs, nan_equal=True),
                      f' (on inputs with their selectors drawn anew, draw {d})')
        for d, inputs in enumerate(self.selector_draws)
    ]
    inputs = self.generic if self.generic is not None else self.inputs
    gradients = self._compare_gradients(copies, inputs)
    if gradients is not None:
      verdicts.append(self._verdict(gradients, ' (backward)'))
    trained = None
    if self._training is not None and self._mode('training') is not None:
      trained = self._verdict(
          self._run(copies, inputs, 'training', nan_equal=True),
          ' (in training, both sides drawing the same keys in call order)')
    return _worst(verdicts), trained

  def check(self, copies: Mapping[Hashable, Hashable]) -> Verdict:
    """Both models with each NNX slot drawn as `copies[slot]` (a Linen
    slot), on the example inputs and, if they agree there, on them made
    generic."""
    verdict = self._verdict(self._run(copies, self.inputs))
    if not verdict.agree or self.generic is None:
      return verdict
    again = self._verdict(self._run(copies, self.generic), ' (on the example inputs made generic)')
    worse = again if not again.difference <= verdict.difference else verdict  # NaN is worse
    return Verdict(again.agree, verdict.exact and again.exact, worse.difference, worse.where)

  @staticmethod
  def _verdict(compared, on: str = '') -> Verdict:
    exact, agree, worst, where = True, True, 0.0, ''
    for name, width, s in compared:
      if s == ():
        return Verdict(False, False, math.inf, name + ' (shapes or dtypes differ)' + on)
      equal, difference, scale = (float(v) for v in s)
      exact = exact and bool(equal)
      relative = difference / max(scale, 1e-30) if difference else 0.0
      if not relative <= worst:
        worst, where = relative, name + on
      if not equal and not relative <= TOLERANCE.get(width, 1e-4):
        agree = False
    return Verdict(agree, exact, worst, where)

  def idle(self) -> frozenset:
    """Linen slots whose value reaches no output on the example inputs
    (given or made generic), or reaches them too little for a run to see it (below `REACH` of their
    scale: a query and a key on constant tokens move the outputs only by
    rounding, through a softmax of equal logits)."""
    idle = None
    for inputs in (self.inputs, self.generic):  # seen in either run is witnessed
      if inputs is None:
        continue
      with outside_any_mesh():
        reach = jax.device_get(self._influence(inputs))
      unseen = {slot for slot, value in reach.items() if not float(value) > REACH}
      idle = unseen if idle is None else idle & unseen
    return frozenset(idle)


@jax.jit
def _effect(gradient, value):
  """`(the sum of |gradient x value|, that sum for each slice of the
  leading axis)`, in float32."""
  effect = jnp.abs(gradient.astype(jnp.float32) * value.astype(jnp.float32))
  by_layer = jnp.sum(effect, axis=tuple(range(1, effect.ndim))) if effect.ndim else effect[None]
  return jnp.sum(effect), by_layer


@functools.lru_cache(maxsize=32)
def _influence_of(closed, outputs: int, written: frozenset, floats: tuple) -> Callable:
  """`(values, inputs) -> (gradients of the floating values, scale)` of a
  random projection of `closed`'s outputs (the first `outputs`, and those
  in `written`), compiled once per program: every witness of one Linen
  trace (each inference run of a search) takes its values as arguments."""
  run = jaxpr_as_fun(closed)

  def projection(chosen, values, inputs):
    values = list(values)
    for k, v in zip(floats, chosen):
      values[k] = v
    return _projection(run(*values, *inputs), lambda k: k < outputs or k in written)

  def influence(values, inputs):
    return jax.grad(projection, has_aux=True)([values[k] for k in floats], values, inputs)

  return jax.jit(influence)


def _projection(outputs, kept: Callable[[int], bool]):
  """`(total, scale)` of a random projection of the floating `outputs` whose
  index is `kept`: the same weights for output k on either side (a counter
  hash), `total` their weighted sum, `scale` the sum of its terms' sizes."""
  total, scale = jnp.float32(0), jnp.float32(0)
  for k, out in enumerate(outputs):
    if kept(k) and jnp.issubdtype(out.dtype, jnp.floating):
      weighted = out.astype(jnp.float32) * _hash_uniform(7_919 + k, out.shape, jnp.float32)
      total, scale = total + jnp.sum(weighted), scale + jnp.sum(jnp.abs(weighted))
  return total, scale


def _worst(verdicts: Sequence[Verdict]) -> Verdict:
  """One verdict for several runs: agreeing and exact where all are, the
  largest difference (NaN the largest) and where."""
  worst = max(verdicts, key=lambda v: v.difference if v.difference == v.difference else math.inf)
  return Verdict(all(v.agree for v in verdicts), all(v.exact for v in verdicts),
                 worst.difference, worst.where)


def _by_input(slots) -> dict[int, set]:
  found: dict[int, set] = {}
  for slot in slots:
    found.setdefault(slot[0], set()).add(slot)
  return found


def _drawn(aval, slots, seed_of, layer=None):
  """An input of shape `aval` whose slots are `(k, layer)` or `(k, None)`
  (`layer`: only that slice of it, drawn alone)."""
  shape, dtype = tuple(aval.shape), aval.dtype
  if jnp.issubdtype(dtype, jax.dtypes.prng_key):
    key = jax.random.key(0)
    keys = jax.random.split(key, shape) if shape else key
    return keys if layer is None else keys[layer]
  layers = sorted(slot[1] for slot in slots if slot[1] is not None)
  if layers and layers == list(range(shape[0])):
    k = next(iter(slots))[0]
    if layer is not None:
      return _draw(seed_of((k, layer)), shape[1:], dtype)
    return _draw_layers(jnp.asarray([seed_of((k, l)) for l in layers], jnp.int32), shape[1:], dtype)
  seed = seed_of(min(slots, key=repr)) if slots else 0  # 0: other state (RNG counts), alike on both sides
  return _draw(seed, shape, dtype, layer)


@functools.lru_cache(maxsize=64)
def _jitted(step: Step) -> Callable:
  """A given rule's `step`, jitted: one program per shape, not one per
  operation (a rearrangement moves values, bit for bit)."""
  return jax.jit(step)


def _on_one_device(value) -> jax.Array:
  """A given array (placed anywhere, sharded or not) on the device the witness runs on."""
  return jax.device_put(value, jax.local_devices()[0])


def _shaped(transform: Rearrange, value, shape: tuple):
  """`value`, which `transform` made for a variable of `shape`, or the refusal."""
  if tuple(value.shape) != tuple(shape):
    raise PathMappingError(
        f'{transform!r} makes {tuple(value.shape)} where the NNX variable is {tuple(shape)}'
    )
  return value


def _layer(value, layer):
  return value if layer is None else value[layer]


def _alike(x, y) -> bool:
  return tuple(x.shape) == tuple(y.shape) and x.dtype == y.dtype


@functools.partial(jax.jit, static_argnames=('nan_equal',))
def _difference(x, y, nan_equal: bool = False):
  """`(equal, max |x - y|, the largest |x|, |y| where they differ)`, in one
  program per shape and dtype; `nan_equal`: an element NaN on both sides is
  equal."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x, y = jax.random.key_data(x), jax.random.key_data(y)
  if not x.size:
    return (jnp.bool_(True), jnp.float32(0), jnp.float32(0))
  if nan_equal and jnp.issubdtype(x.dtype, jnp.inexact):
    both = jnp.isnan(x) & jnp.isnan(y)
    x, y = jnp.where(both, 0, x), jnp.where(both, 0, y)
  equal = jnp.all(x == y)  # NaN is never equal: outputs that overflow decide nothing
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    return (equal, jnp.where(equal, 0.0, jnp.inf).astype(jnp.float32), jnp.float32(1))
  fx, fy = x.astype(jnp.float32), y.astype(jnp.float32)
  # The scale of the elements that differ: an element equal on both sides (a
  # mask's -1e9) must not make a wrong difference elsewhere look small.
  differ = fx != fy
  scale = jnp.max(jnp.where(differ, jnp.maximum(jnp.abs(fx), jnp.abs(fy)), 0.0))
  return (equal, jnp.max(jnp.abs(fx - fy)), scale)
