"""The dataflow graph makes alike what correct ports write differently, and
keeps apart what they cannot: compared as multisets of node labels and of
the roles of each contraction's operands."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P

from converters.inference.dataflow import Graph
from converters.inference.traces import Trace

X = jax.ShapeDtypeStruct((8, 4), jnp.float32)
W = jax.ShapeDtypeStruct((4, 4), jnp.float32)


def graph(f, *avals) -> Graph:
  closed, shape = jax.make_jaxpr(lambda w, x: (f(w, x), [w]), return_shape=True)(*avals)
  trace = Trace(closed, (('params', ('w',)),), inputs=1, outputs=len(jax.tree.leaves(shape[0])))
  return Graph.of(trace)


def summary(g: Graph):
  """Labels of the nodes that take part (a scale by a constant leaves its
  constant behind, unused), and the edges between them."""
  used = {s for s, _, _ in g.edges} | {t for _, _, t in g.edges}
  return collections.Counter(g.labels[n] for n in sorted(used)), collections.Counter(
      (g.labels[s], e, g.labels[t]) for s, e, t in g.edges
  )


def test_the_forms_of_one_contraction_are_alike():
  forms = [
      lambda w, x: x @ w,
      lambda w, x: jnp.dot(x, w),
      lambda w, x: jnp.einsum('bi,io->bo', x, w),
      lambda w, x: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ()))),
      lambda w, x: (x * 2.0) @ w / 2.0 * 1.0,  # scales by constants
      lambda w, x: jax.checkpoint(lambda a: a @ w.astype(jnp.bfloat16).astype(jnp.float32))(x),
  ]
  first = summary(graph(forms[0], W, X))
  for form in forms[1:]:
    assert summary(graph(form, W, X)) == first


def test_a_kernel_stored_transposed_is_not_alike():
  assert summary(graph(lambda w, x: jnp.einsum('bi,oi->bo', x, w), W, X)) != summary(graph(lambda w, x: x @ w, W, X))


def test_a_transpose_is_read_through_by_the_contraction_it_feeds():
  stored_out_in = summary(graph(lambda w, x: jnp.einsum('bi,oi->bo', x, w), W, X))
  assert summary(graph(lambda w, x: x @ w.T, W, X)) == stored_out_in
  assert summary(graph(lambda w, x: x @ w.T.astype(jnp.bfloat16).T.T, W, X)) == stored_out_in
  assert summary(graph(lambda w, x: x @ w.T, W, X)) != summary(graph(lambda w, x: x @ w, W, X))
  assert summary(graph(lambda w, x: x.T.T @ jnp.swapaxes(w.T, 0, 1), W, X)) == summary(graph(lambda w, x: x @ w, W, X))


def test_a_variable_transposed_and_used_otherwise_is_a_node_of_its_own():
  assert summary(graph(lambda w, x: x @ (w.T + 1.0), W, X)) != summary(graph(lambda w, x: x @ (w + 1.0), W, X))
  assert summary(graph(lambda w, x: x @ w.T.reshape(4, 4), W, X)) != summary(graph(lambda w, x: x @ w, W, X))


def test_sharding_constraints_in_any_form_are_transparent():
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    plain = summary(graph(lambda w, x: jnp.tanh(x @ w), W, X))
    constrained = summary(graph(
        lambda w, x: jax.lax.with_sharding_constraint(
            jnp.tanh(jax.lax.with_sharding_constraint(x, P('data')) @ w), P('data', 'model')),
        W, X,
    ))
  assert constrained == plain


def test_tile_and_broadcast_to_are_alike():
  row = jax.ShapeDtypeStruct((1, 4), jnp.float32)
  tiled = summary(graph(lambda w, x: x + jnp.tile(w, (8, 1)), row, X))
  broadcast = summary(graph(lambda w, x: x + jnp.broadcast_to(w, (8, 4)), row, X))
  assert tiled == broadcast


def test_operands_of_sums_commute_and_of_differences_do_not():
  assert summary(graph(lambda w, x: x @ w + x, W, X)) == summary(graph(lambda w, x: x + x @ w, W, X))
  assert summary(graph(lambda w, x: x @ w - x, W, X)) != summary(graph(lambda w, x: x - x @ w, W, X))


def test_index_arithmetic_is_the_input_it_comes_from():
  table = jax.ShapeDtypeStruct((16, 4), jnp.float32)
  tokens = jax.ShapeDtypeStruct((2, 3), jnp.int32)
  indexed = summary(graph(lambda w, t: w[t], table, tokens))
  taken = summary(graph(lambda w, t: jnp.take(w, t, axis=0), table, tokens))
  assert indexed == taken


def test_a_scan_that_returns_its_state_as_it_is_is_alike():
  # An NNX scan hands back the stacked state it was given (as a scanned
  # result, here also the variable's new value) through the call of its
  # body (`nnx.remat`), where JAX does not forward it; `nn.scan` does not.
  stack = jax.ShapeDtypeStruct((3, 4, 4), jnp.float32)

  def scanned(f):
    closed, shape = jax.make_jaxpr(f, return_shape=True)(stack, X)
    trace = Trace(closed, (('params', ('w',)),), inputs=1, outputs=1)
    return summary(Graph.of(trace))

  linen = scanned(lambda w, x: (jax.lax.scan(lambda h, w_k: (jnp.tanh(h @ w_k), None), x, w)[0], [w]))

  def nnx_like(w, x):
    h, w_out = jax.lax.scan(jax.checkpoint(lambda h, w_k: (jnp.tanh(h @ w_k), w_k)), x, w)
    return h, [w_out]

  def carried(w, x):  # the state as a carry the body returns in its place
    body = jax.checkpoint(lambda c, _: ((jnp.tanh(c[0] @ c[1][0]), c[1]), None))
    (h, w_out), _ = jax.lax.scan(body, (x, w), None, length=3)
    return h, [w_out]

  assert scanned(nnx_like) == linen
  # a scan that returns its scanned operand changed is not alike
  assert scanned(lambda w, x: (lambda h, w2: (h, [w2]))(*jax.lax.scan(lambda h, w_k: (jnp.tanh(h @ w_k), w_k * 2.0 + 1.0), x, w))) != linen
  # a carry returned in its place leaves no result of its own, only the one that changes
  labels, edges = scanned(carried)
  assert labels[('scan', 3, False, 'final')] == 1
  assert not [e for e in edges if e[1] == 'next' and e[0] == e[2]]


def test_leading_rows_of_a_table_are_one_form_however_taken():
  table = jax.ShapeDtypeStruct((16, 4), jnp.float32)
  forms = [
      lambda w, x: x + w[:8],
      lambda w, x: x + jnp.take(w, jnp.arange(8), axis=0),
      lambda w, x: x + w[jnp.arange(8)],
      lambda w, x: x + jax.lax.dynamic_slice_in_dim(w, 0, 8),
  ]
  first = summary(graph(forms[0], table, X))
  for form in forms[1:]:
    assert summary(graph(form, table, X)) == first
  # Rows picked by the inputs are a lookup, not the program's own rows.
  tokens = jax.ShapeDtypeStruct((8,), jnp.int32)
  assert summary(graph(lambda w, t: w[t], table, tokens)) != summary(graph(lambda w, t: w[:8] + 0 * t[:, None], table, tokens))


def test_a_value_computed_twice_is_one_value():
  plain = summary(graph(lambda w, x: jnp.tanh(x @ w) + x @ w, W, X))
  twice = summary(graph(lambda w, x: (jnp.tanh(x @ w).shape, jnp.tanh(x @ w) + x @ w)[1], W, X))
  assert twice == plain


def test_a_placement_of_several_operands_places_each_as_it_is():
  device = jax.devices()[0]
  placed = summary(graph(lambda w, x: jnp.tanh(jax.device_put((x, w), device)[0] @ jax.device_put((x, w), device)[1]), W, X))
  assert placed == summary(graph(lambda w, x: jnp.tanh(x @ w), W, X))


def test_each_node_is_made_for_the_equation_that_reads_or_returns_it():
  def f(w, x):
    h = jax.jit(lambda a: a @ w + jnp.arange(4.0))(x) * 3.0
    return jax.lax.cond(x[0, 0] > 0, lambda a: jax.jit(jnp.tanh)(a), lambda a: a * 2.0, h)

  g = graph(f, W, X)
  made_for = lambda label: [tuple(e.primitive.name if e is not None else None for e in g.origins[n])
                            for n, l in enumerate(g.labels) if l[0] == label]
  # The literal 3.0 is the multiplication's, the `arange` of the call is made
  # inside it, and the cond's results are the cond's, not its last branch's.
  assert made_for('constant') == [('iota', 'jit'), ('mul',), ('gt',), ('mul',)]
  assert made_for('cond') == [('cond',)]
