"""The numerical witness: an inferred mapping is checked by running both models.

Both traced forward passes run on the example inputs with every variable
drawn at random, independently of every other (a counter hash of its own
seed: nothing to store, nothing shared between two variables), the NNX
model's converted from the Linen model's through the mapping under test.
A wrong pair changes the outputs at the scale of the values themselves, so
the outputs must agree: bit for bit when XLA computes both alike, else
within `TOLERANCE` of their scale (the two programs may order floating
point operations differently: a scale applied one step later, a sum
reassociated). New values of variables the call writes (a decode cache,
batch statistics) are compared too.

A pair is only witnessed if its variable reaches an output: the gradient of
a random projection of the Linen model's outputs tells which variables do
(`Verdict.idle`). Both programs run under one `jax.jit` each, variables
generated inside it, so nothing the size of the model is held on the host;
the NNX side takes its seeds as an argument, so the permutations of a group
the structure cannot split are tried without compiling again.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun

from converters.inference.tracing import Trace
from converters.transforms import Rearrange

#: Largest difference, relative to the outputs' scale, accepted between two
#: programs that compute alike in another order, by output dtype width.
TOLERANCE = {8: 1e-9, 4: 1e-4, 2: 3e-2}


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
  """What the witness found: `agree`, `exact` (bit for bit), the largest
  relative difference and where, and the Linen slots that reached no output."""

  agree: bool
  exact: bool
  difference: float
  where: str
  idle: frozenset


def _hash_uniform(seed, shape, dtype):
  """Values in [-1, 1) from a counter hash of `seed` and each element's index."""
  size = math.prod(shape)
  i = jax.lax.iota(jnp.uint32, max(size, 1))[:size]
  x = i * jnp.uint32(0x9E3779B1) + jnp.asarray(seed, jnp.uint32) * jnp.uint32(0x85EBCA77)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x2C1B3C6D)
  x = x ^ (x >> 12)
  x = x * jnp.uint32(0x297A2D39)
  x = x ^ (x >> 15)
  u = (x >> 8).astype(jnp.float32) * (2.0 / (1 << 24)) - 1.0
  return u.reshape(shape).astype(dtype)


def draw(seed, shape: tuple[int, ...], dtype) -> jax.Array:
  """A variable's witness value: a kernel at unit variance of its fan-in
  (`shape[:-1]`), a vector around one (a scale, a bias or a variance: never
  zero, never negative), integers zero (counters, cache indices)."""
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.inexact):
    return jnp.zeros(shape, dtype)
  u = _hash_uniform(seed, shape, jnp.float32)
  if len(shape) >= 2:
    value = u * math.sqrt(3.0 / max(math.prod(shape[:-1]), 1))
  else:
    value = 1.0 + 0.25 * u
  return value.astype(dtype)


def example_inputs(avals: Sequence, given: Sequence) -> list:
  """The given arrays, or for an abstract input values of its shape:
  integers in {0, 1} (indices valid for any table), booleans, or floats."""
  out = []
  for k, (aval, value) in enumerate(zip(avals, given)):
    if not isinstance(value, jax.ShapeDtypeStruct) and hasattr(value, 'shape'):
      out.append(jnp.asarray(value))
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
  """Both traces compiled once; `check(copies)` runs them with each NNX slot
  drawn as its Linen partner, `idle()` tells which Linen slots reach no output.

  Args:
    linen, nnx: the traces (the inputs of both are the same example inputs).
    inputs: the example inputs' leaves (arrays or `ShapeDtypeStruct`s).
    slots: Linen slots (`(input index, layer or None)`) in seed order.
    nnx_slots: the NNX slots the pairs under test draw.
    fused: `{nnx input index: Fused}` for given rules with a transform.
  """

  def __init__(
      self, linen: Trace, nnx: Trace, inputs: Sequence, slots: Sequence[Hashable],
      nnx_slots: Sequence[Hashable], fused: Mapping[int, Fused],
  ):
    self.linen, self.nnx = linen, nnx
    self.slots = list(slots)
    self.index = {s: k for k, s in enumerate(self.slots)}
    self.nnx_slots = list(nnx_slots)
    self.position = {s: k for k, s in enumerate(self.nnx_slots)}
    self.fused = dict(fused)
    self.linen_keys = _by_input(self.slots)
    self.nnx_keys = _by_input(self.nnx_slots)
    avals = [v.aval for v in linen.closed.jaxpr.invars[len(linen.variables):]]
    self.inputs = example_inputs(avals, inputs)
    self.meta: list[tuple[str, int, bool]] = []
    self._check = jax.jit(self._run)
    self._idle = jax.jit(self._influence)

  # -- values --------------------------------------------------------------

  def _linen_values(self) -> list:
    return [
        _drawn(var.aval, self.linen_keys.get(k, ()), lambda slot: self.index[slot] + 1)
        for k, var in enumerate(self.linen.closed.jaxpr.invars[:len(self.linen.variables)])
    ]

  def _nnx_values(self, partner, linen_values) -> list:
    values = []
    for k, var in enumerate(self.nnx.closed.jaxpr.invars[:len(self.nnx.variables)]):
      if k in self.nnx.constants:
        values.append(jnp.asarray(self.nnx.constants[k]))
      elif k in self.fused:
        f = self.fused[k]
        sources = [_slot_value(s, linen_values) for s in f.sources]
        values.append(f.transform.apply(sources, 'linen', f.lead, f.parts)[f.part])
      else:
        values.append(_drawn(
            var.aval, self.nnx_keys.get(k, ()), lambda slot: partner[self.position[slot]] + 1
        ))
    return values

  # -- runs ----------------------------------------------------------------

  def _run(self, partner, inputs):
    linen_values = self._linen_values()
    a = jaxpr_as_fun(self.linen.closed)(*linen_values, *inputs)
    b = jaxpr_as_fun(self.nnx.closed)(*self._nnx_values(partner, linen_values), *inputs)
    n = self.linen.outputs
    if n != self.nnx.outputs:
      self.meta = [(f'the models return {n} and {self.nnx.outputs} arrays', 0, False)]
      return []
    self.meta, stats = [], []
    for k, (x, y) in enumerate(zip(a[:n], b[:n])):
      self.meta.append((f'output {k} {tuple(x.shape)}', jnp.dtype(x.dtype).itemsize, _alike(x, y)))
      stats.append(_difference(x, y) if _alike(x, y) else ())
    updates = (
        {k: a[out] for out, k in self.linen.updated},
        {k: b[out] for out, k in self.nnx.updated},
    )
    return stats, updates

  def _influence(self, inputs):
    linen_values = self._linen_values()
    floats = [k for k, v in enumerate(linen_values) if jnp.issubdtype(v.dtype, jnp.floating)]

    def projection(chosen):
      values = list(linen_values)
      for k, v in zip(floats, chosen):
        values[k] = v
      total = jnp.float32(0)
      written = {out for out, _ in self.linen.updated}
      for k, out in enumerate(jaxpr_as_fun(self.linen.closed)(*values, *inputs)):
        if (k < self.linen.outputs or k in written) and jnp.issubdtype(out.dtype, jnp.floating):
          total = total + jnp.sum(out.astype(jnp.float32) * _hash_uniform(7_919 + k, out.shape, jnp.float32))
      return total

    grads = jax.grad(projection)([linen_values[k] for k in floats])
    reach = {}
    for k, g in zip(floats, grads):
      magnitude = jnp.abs(g.astype(jnp.float32))
      for slot in self.linen_keys.get(k, ()):
        part = magnitude if slot[1] is None else magnitude[slot[1]]
        reach[slot] = jnp.max(part) if part.size else jnp.float32(0)
    return reach

  # -- public --------------------------------------------------------------

  def check(self, copies: Mapping[Hashable, Hashable]) -> Verdict:
    """Both models with each NNX slot drawn as `copies[slot]` (a Linen slot)."""
    partner = np.array([self.index[copies[s]] for s in self.nnx_slots], np.int32)
    found = self._check(partner, self.inputs)
    if not found:
      return Verdict(False, False, math.inf, self.meta[0][0], frozenset())
    stats, (linen_new, nnx_new) = jax.device_get(found)
    compared = [(name, width, s) for (name, width, _), s in zip(self.meta, stats)]
    for slot in self.nnx_slots:
      k = copies[slot]
      if slot[0] in nnx_new and k[0] in linen_new:
        x, y = linen_new[k[0]], nnx_new[slot[0]]
        x, y = (x if k[1] is None else x[k[1]]), (y if slot[1] is None else y[slot[1]])
        name = f'the new value of a variable the call writes {tuple(np.shape(x))}'
        if np.shape(x) != np.shape(y):
          return Verdict(False, False, math.inf, name + ' (shapes differ)', frozenset())
        compared.append((name, np.asarray(x).dtype.itemsize, _host_difference(x, y)))
    exact, agree, worst, where = True, True, 0.0, ''
    for name, width, s in compared:
      if s == ():
        return Verdict(False, False, math.inf, name + ' (shapes or dtypes differ)', frozenset())
      equal, difference, scale = (float(v) for v in s)
      exact = exact and bool(equal)
      relative = difference / max(scale, 1e-30) if difference else 0.0
      if not relative <= worst:
        worst, where = relative, name
      if not equal and not relative <= TOLERANCE.get(width, 1e-4):
        agree = False
    return Verdict(agree, exact, worst, where, frozenset())

  def idle(self) -> frozenset:
    """Linen slots whose value reaches no output on the example inputs."""
    reach = jax.device_get(self._idle(self.inputs))
    return frozenset(slot for slot, value in reach.items() if not float(value) > 0)


def _by_input(slots) -> dict[int, set]:
  found: dict[int, set] = {}
  for slot in slots:
    found.setdefault(slot[0], set()).add(slot)
  return found


def _drawn(aval, slots, seed_of):
  """An input of shape `aval` whose slots are `(k, layer)` or `(k, None)`."""
  shape, dtype = tuple(aval.shape), aval.dtype
  if jnp.issubdtype(dtype, jax.dtypes.prng_key):
    key = jax.random.key(0)
    return jax.random.split(key, shape) if shape else key
  layers = sorted(slot[1] for slot in slots if slot[1] is not None)
  if layers and layers == list(range(shape[0])):
    k = next(iter(slots))[0]
    return jnp.stack([draw(seed_of((k, layer)), shape[1:], dtype) for layer in layers])
  if slots:
    return draw(seed_of(next(iter(slots))), shape, dtype)
  return draw(0, shape, dtype)  # other state (RNG counts): alike on both sides


def _slot_value(slot, linen_values):
  value = linen_values[slot[0]]
  return value if slot[1] is None else value[slot[1]]


def _alike(x, y) -> bool:
  return tuple(x.shape) == tuple(y.shape) and x.dtype == y.dtype


def _difference(x, y):
  """`(equal, max |x - y|, max |x|, |y|)` of two arrays, in the program."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x, y = jax.random.key_data(x), jax.random.key_data(y)
  if not x.size:
    return (jnp.bool_(True), jnp.float32(0), jnp.float32(0))
  equal = jnp.all(x == y)  # NaN is never equal: outputs that overflow decide nothing
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    return (equal, jnp.where(equal, 0.0, jnp.inf).astype(jnp.float32), jnp.float32(1))
  fx, fy = x.astype(jnp.float32), y.astype(jnp.float32)
  return (equal, jnp.max(jnp.abs(fx - fy)), jnp.maximum(jnp.max(jnp.abs(fx)), jnp.max(jnp.abs(fy))))


def _host_difference(x, y):
  x, y = np.asarray(x), np.asarray(y)
  if not x.size:
    return (True, 0.0, 0.0)
  if not np.issubdtype(x.dtype, np.inexact):
    equal = bool(np.array_equal(x, y))
    return (equal, 0.0 if equal else math.inf, 1.0)
  fx, fy = x.astype(np.float64), y.astype(np.float64)
  equal = bool(np.array_equal(x, y))
  return (equal, float(np.max(np.abs(fx - fy))), float(max(np.max(np.abs(fx)), np.max(np.abs(fy)))))
