"""A trace with its scans unrolled computes what the trace does, reads each
layer of a stacked variable as a `slice` of axis 0, and writes a variable
back only where the trace does."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxpr_as_fun, jaxprs_in_params

from converters.inference.dataflow import Graph
from converters.inference.traces import Trace
from converters.inference.unrolling import unrolled

W = jax.ShapeDtypeStruct((3, 4, 4), jnp.float32)  # three stacked layers
B = jax.ShapeDtypeStruct((4,), jnp.float32)
X = jax.ShapeDtypeStruct((2, 4), jnp.float32)
NAMES = (('params', ('w',)), ('params', ('b',)))


def trace(f) -> Trace:
  """`f(w, b, x) -> (outputs, [new w, new b])` traced as a model's call."""
  closed, shape = jax.make_jaxpr(f, return_shape=True)(W, B, X)
  return Trace(closed, NAMES, inputs=1, outputs=len(jax.tree.leaves(shape[0])))


def run(t: Trace):
  args = [jax.random.normal(jax.random.key(k), a.shape) for k, a in enumerate((W, B, X))]
  return jaxpr_as_fun(t.closed)(*args)


def primitives(t: Trace) -> set[str]:
  """The primitives `t` runs, in calls too."""
  found, jaxprs = set(), [t.closed.jaxpr]
  while jaxprs:
    for eqn in jaxprs.pop().eqns:
      found.add(eqn.primitive.name)
      jaxprs.extend(getattr(j, 'jaxpr', j) for j in jaxprs_in_params(eqn.params))
  return found


def layer(h, w_k, b):
  return jnp.tanh(h @ w_k + b)


CASES = {
    'forward': lambda w, b, x: (jax.lax.scan(lambda h, w_k: (layer(h, w_k, b), jnp.sum(h)), x, w), [w, b]),
    'reverse': lambda w, b, x: (
        jax.lax.scan(lambda h, w_k: (layer(h, w_k, b), h), x, w, reverse=True), [w, b]),
    # an NNX scan: its body under remat, the state handed back through it
    'state_returned': lambda w, b, x: (lambda h, w_out: (h, [w_out, b]))(*jax.lax.scan(
        jax.checkpoint(lambda h, w_k: (layer(h, w_k, b), w_k)), x, w)),
    'in_a_jit': lambda w, b, x: (jax.jit(lambda w, x: jax.lax.scan(
        lambda h, w_k: (layer(h, w_k, b), None), x, w)[0])(w, x), [w, b]),
    'in_a_cond': lambda w, b, x: (jax.lax.cond(
        jnp.sum(x) > 0, lambda x: jax.lax.scan(lambda h, w_k: (layer(h, w_k, b), None), x, w)[0],
        lambda x: -x, x), [w, b]),
    'in_a_while': lambda w, b, x: (jax.lax.while_loop(
        lambda c: c[1] < 2,
        lambda c: (jax.lax.scan(lambda h, w_k: (layer(h, w_k, b), None), c[0], w)[0], c[1] + 1),
        (x, 0))[0], [w, b]),
    'nested': lambda w, b, x: (jax.lax.scan(
        lambda h, w_k: (jax.lax.scan(lambda g, _: (layer(g, w_k, b), None), h, None, length=2)[0], None),
        x, w)[0], [w, b]),
}


@pytest.mark.parametrize('case', CASES)
def test_it_computes_what_the_trace_does_with_no_scan_left(case):
  t = trace(CASES[case])
  flat = unrolled(t)
  assert 'scan' in primitives(t) and 'scan' not in primitives(flat)
  assert {'pjit', 'jit', 'checkpoint', 'remat2'}.isdisjoint(primitives(flat))
  for got, expected in zip(run(flat), run(t), strict=True):
    # the same operations, one layer at a time: XLA may fuse them otherwise
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
  assert flat.variables == t.variables and flat.outputs == t.outputs


@pytest.mark.parametrize('case', CASES)
def test_it_writes_a_variable_back_only_where_the_trace_does(case):
  t = trace(CASES[case])
  flat = unrolled(t)
  assert flat.updated == t.updated
  graph = Graph.of(flat, stacked=[0])
  assert ('update',) not in graph.labels


def test_a_stack_handed_back_as_it_was_taken_is_the_stacked_variable():
  # An NNX scan's state, stacked again layer by layer: nothing of it is
  # left in the graph, which is the graph of a scan that hands back nothing.
  def labels(case):
    graph = Graph.of(unrolled(trace(case)), stacked=[0])
    used = {s for s, _, _ in graph.edges} | {t for _, _, t in graph.edges}
    return collections.Counter(graph.labels[n] for n in used)

  plain = lambda w, b, x: (jax.lax.scan(lambda h, w_k: (layer(h, w_k, b), None), x, w)[0], [w, b])
  assert labels(CASES['state_returned']) == labels(plain)


def test_each_layer_of_a_stacked_variable_is_a_variable_of_its_own():
  graph = Graph.of(unrolled(trace(CASES['reverse'])), stacked=[0])
  assert sorted(k for k in graph.variables) == [(0, 0), (0, 1), (0, 2), (1, None)]


def test_a_trace_without_a_scan_comes_back_as_it_is():
  t = trace(lambda w, b, x: (layer(x, w[0], b), [w, b]))
  assert unrolled(t) is t
