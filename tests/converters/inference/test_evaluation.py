"""Running a traced program operation by operation: the same values as the
program itself, each variable made when first read (one layer at a time by a
scan over it), never one that is not read, on one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun
from jax.sharding import AxisType, PartitionSpec as P

from converters.inference.evaluation import Program, evaluate, outside_any_mesh

W = jax.ShapeDtypeStruct((3, 4, 4), jnp.float32)  # three stacked layers
B = jax.ShapeDtypeStruct((4,), jnp.float32)
X = jax.ShapeDtypeStruct((2, 4), jnp.float32)


def values(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape)


class Source:
  """Variables made on demand, each call recorded as `(k, layer)`."""

  def __init__(self, avals):
    self.avals, self.calls = avals, []

  def __call__(self, k, layer):
    self.calls.append((k, layer))
    whole = values(k, self.avals[k].shape)
    return whole if layer is None else whole[layer]


def run(f, *avals, n_variables=2):
  closed = jax.make_jaxpr(f)(*avals)
  source = Source(avals)
  inputs = [values(10 + k, a.shape) for k, a in enumerate(avals[n_variables:])]
  with outside_any_mesh():
    got = evaluate(Program.of(closed), n_variables, source, inputs)
  whole = [values(k, a.shape) for k, a in enumerate(avals[:n_variables])]
  expected = jaxpr_as_fun(closed)(*whole, *inputs)
  return got, expected, source


def close(a, b):
  # A scan run one iteration at a time rounds as its operations do one by
  # one; the program compiled whole may fuse them (a last-bit difference).
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def scanned(w, b, x):
  def layer(h, w_k):
    return jnp.tanh(h @ w_k + b), jnp.sum(h)
  return jax.lax.scan(layer, x, w)


def test_calls_are_inlined_and_the_values_are_the_programs_own():
  @jax.jit
  def block(w, b, x):
    return jax.checkpoint(lambda x: jax.nn.gelu(x @ w[0] + b))(x)

  got, expected, _ = run(block, W, B, X)
  close(got[0], expected[0])


def test_a_scan_over_a_variable_makes_it_one_layer_at_a_time():
  got, expected, source = run(scanned, W, B, X)
  for a, b in zip(got, expected):
    close(a, b)
  assert sorted(source.calls) == [(0, 0), (0, 1), (0, 2), (1, None)]


def test_a_reversed_scan_makes_its_layers_in_reverse_and_stacks_in_order():
  reverse = lambda w, b, x: jax.lax.scan(lambda h, w_k: (h @ w_k + b, h), x, w, reverse=True)
  got, expected, source = run(reverse, W, B, X)
  for a, b in zip(got, expected):
    close(a, b)
  assert [c for c in source.calls if c[0] == 0] == [(0, 2), (0, 1), (0, 0)]


def test_a_variable_also_read_outside_the_scan_is_made_whole():
  both = lambda w, b, x: (scanned(w, b, x)[0], jnp.sum(w))
  got, expected, source = run(both, W, B, X)
  close(got[1], expected[1])
  assert (0, None) in source.calls


def test_a_variable_never_read_is_never_made_and_one_returned_as_it_is_comes_back_none():
  got, _, source = run(lambda w, b, x: (x * 2, w, b), W, B, X)
  assert source.calls == [] and got[1] is None and got[2] is None


def test_a_scan_that_returns_its_scanned_variable_stacks_nothing():
  # An NNX scan's state: the stacked variable comes back through the scan.
  def nnx_like(w, b, x):
    h, (w_out, _) = jax.lax.scan(lambda h, w_k: (jnp.tanh(h @ w_k + b), (w_k, jnp.sum(h))), x, w)
    return h, w_out
  got, expected, source = run(nnx_like, W, B, X)
  close(got[0], expected[0])
  assert got[1] is None and (0, None) not in source.calls


def test_under_a_mesh_it_runs_on_one_device():
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
  f = lambda w, b, x: jax.lax.with_sharding_constraint(x, P('data')) @ w[0] + b
  with jax.set_mesh(mesh):
    closed = jax.make_jaxpr(f)(W, B, X)
    with outside_any_mesh():
      out, = evaluate(Program.of(closed), 2, Source((W, B)), [values(10, X.shape)])
  assert len(out.sharding.device_set) == 1
