"""The witness: a correct pairing agrees, bit for bit where the programs are
the same; a swapped pair disagrees; a variable that reaches no output is
reported, since no run can witness it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from converters.inference.traces import Trace
from converters.inference.witness import Witness, draw, generic_inputs, selector_inputs

X = jax.ShapeDtypeStruct((8, 4), jnp.float32)
W = jax.ShapeDtypeStruct((4, 4), jnp.float32)
NAMES = (('params', ('a',)), ('params', ('b',)))


def trace(f) -> Trace:
  closed, shape = jax.make_jaxpr(lambda a, b, x: (f(a, b, x), [a, b]), return_shape=True)(W, W, X)
  return Trace(closed, NAMES, inputs=1, outputs=len(jax.tree.leaves(shape[0])))


def witness(linen, port, idle_ok=False):
  slots = [(0, None), (1, None)]
  return Witness(trace(linen), trace(port), [X], slots, nnx_slots=slots, fused={})


def test_a_correct_pairing_agrees_bit_for_bit_when_the_programs_are_the_same():
  w = witness(lambda a, b, x: jnp.tanh(x @ a) @ b, lambda a, b, x: jnp.tanh(x @ a) @ b)
  verdict = w.check({(0, None): (0, None), (1, None): (1, None)})
  assert verdict.agree and verdict.exact


def test_a_swapped_pair_disagrees_and_the_other_assignment_agrees():
  w = witness(lambda a, b, x: jnp.tanh(x @ a) @ b, lambda a, b, x: jnp.tanh(x @ b) @ a)
  assert not w.check({(0, None): (0, None), (1, None): (1, None)}).agree
  assert w.check({(0, None): (1, None), (1, None): (0, None)}).agree


def test_programs_that_round_differently_agree_within_the_tolerance():
  w = witness(lambda a, b, x: (x @ a) * 3.0 + x @ b, lambda a, b, x: x @ b + (x * 3.0) @ a)
  verdict = w.check({(0, None): (0, None), (1, None): (1, None)})
  assert verdict.agree


def test_a_variable_that_reaches_no_output_is_idle():
  w = witness(lambda a, b, x: x @ a + 0 * jnp.sum(b), lambda a, b, x: x @ a + 0 * jnp.sum(b))
  assert w.idle() == {(1, None)}


def test_drawn_values_are_independent_and_repeatable():
  a, b = draw(1, (64, 64), jnp.float32), draw(2, (64, 64), jnp.float32)
  np.testing.assert_array_equal(a, draw(1, (64, 64), jnp.float32))
  assert abs(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1]) < 0.05
  assert np.all(draw(3, (16,), jnp.float32) > 0)  # scales and variances stay positive


def test_a_large_value_equal_on_both_sides_hides_no_difference_elsewhere():
  # A masked vocabulary entry (-1e9) is far larger than the logits: measured
  # against it, a swapped pair would look like rounding.
  valid = jnp.arange(4) < 3
  w = witness(
      lambda a, b, x: jnp.where(valid, jnp.tanh(x @ a) @ b, -1e9),
      lambda a, b, x: jnp.where(valid, jnp.tanh(x @ b) @ a, -1e9),
  )
  assert not w.check({(0, None): (0, None), (1, None): (1, None)}).agree
  assert w.check({(0, None): (1, None), (1, None): (0, None)}).exact


def test_a_symmetric_example_input_hides_no_transpose():
  # `x.T @ a` is `x @ a` only for a symmetric `x`: the run on the inputs
  # made generic sees it, and keeps signs and zeros (a mask stays a mask).
  x = jax.random.normal(jax.random.key(0), (4, 4))
  symmetric = x + x.T
  slots = [(0, None), (1, None)]
  square = lambda f: Trace(
      jax.make_jaxpr(lambda a, b, x: (f(a, b, x), [a, b]))(W, W, symmetric), NAMES, inputs=1, outputs=1
  )
  w = Witness(square(lambda a, b, x: x @ a + b[0]), square(lambda a, b, x: x.T @ a + b[0]),
              [symmetric], slots, nnx_slots=slots, fused={})
  verdict = w.check({(0, None): (0, None), (1, None): (1, None)})
  assert not verdict.agree and 'generic' in verdict.where
  generic = np.asarray(w.generic[0])
  assert np.all(np.sign(generic) == np.sign(symmetric)) and not np.allclose(generic, generic.T)


def test_inputs_made_generic_keep_what_their_values_mean():
  tokens = jnp.ones((2, 8), jnp.int32)
  ids = jnp.array([[3, 5, 7, 3]])
  length, mask, large = jnp.int32(5), jnp.array([True, False]), 1e5 * jnp.arange(1.0, 5.0)
  generic = generic_inputs([tokens, ids, length, mask, large])
  assert set(np.unique(generic[0])) == {0, 1}  # constant tokens are no longer constant
  assert np.all((generic[1] >= 3) & (generic[1] <= 7)) and not np.array_equal(generic[1], ids)
  assert generic[2] == length and np.array_equal(generic[3], mask)  # a length, a mask: kept
  assert np.all(generic[4] > 0) and np.max(np.abs(generic[4])) <= 1.5  # unit scale, signs kept
  assert generic_inputs([length, mask]) is None


def test_selectors_drawn_anew_take_both_values_and_other_routes():
  keep, flag, route, big = jnp.ones((4, 16), bool), jnp.bool_(True), jnp.int32(0), jnp.int32(1_000_000)
  first, second = (selector_inputs([keep, flag, route, big], d) for d in range(2))
  assert set(np.unique(first[0])) == {False, True} and not np.array_equal(first[0], second[0])
  assert not first[1] and second[1]  # a scalar flag: negated, then as given
  assert first[2] == 1  # the only other value in [0, 1]
  assert 0 <= first[3] < big  # below it: within the range the example shows


def test_an_assignment_alike_forward_but_not_backward_is_not_symmetric():
  @jax.custom_vjp
  def reversed_gradient(y):
    return y

  reversed_gradient.defvjp(lambda y: (y, None), lambda _, g: (-g,))
  w = witness(lambda a, b, x: x @ a + reversed_gradient(x @ b),
              lambda a, b, x: x @ a + reversed_gradient(x @ b))
  assert w.check({(0, None): (1, None), (1, None): (0, None)}).exact  # swapped: alike forward
  assert w.symmetric({(0, None): (0, None), (1, None): (1, None)})[0].exact
  swapped, _ = w.symmetric({(0, None): (1, None), (1, None): (0, None)})
  assert not swapped.agree and 'backward' in swapped.where


def test_a_stacked_variable_drawn_whole_is_its_layers_drawn_alone():
  # The run draws a scanned variable one layer at a time where it reads one
  # layer, and whole elsewhere: both must be the same bits.
  from converters.inference.witness import _drawn

  for dtype in (jnp.float32, jnp.bfloat16, jnp.int32):
    aval = jax.ShapeDtypeStruct((3, 4, 5), dtype)
    slots = {(7, layer) for layer in range(3)}
    seed_of = lambda slot: 11 + 13 * slot[1]
    whole = np.asarray(_drawn(aval, slots, seed_of))
    for layer in range(3):
      alone = np.asarray(_drawn(aval, slots, seed_of, layer))
      assert whole[layer].tobytes() == alone.tobytes(), (dtype, layer)
    assert whole[0].tobytes() != whole[1].tobytes()  # each layer its own seed
