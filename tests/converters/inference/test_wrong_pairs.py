"""Ports that inference once paired wrongly with every check green, or
refused although they change nothing: each maps correctly, proven by the
outputs of the models converted through the mapping, or is refused naming
what to write; none converts wrongly."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from converters import infer_paths, linen_to_nnx
from converters.errors import PathMappingError
from tests.converters.inference.call_order_masks import masks_in_call_order
from tests.converters.inference.ports import CASES


def unseen(case, draw: int) -> list:
  """Inputs inference never saw: floats drawn anew, booleans drawn both ways."""
  key = lambda k: jax.random.key(7 + 31 * draw + k)
  return [
      jax.random.normal(key(k), x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else jax.random.bernoulli(key(k), 0.5, x.shape) if x.dtype == jnp.bool_
      else x
      for k, x in enumerate(case.inputs)
  ]


def outputs_through(mapping, case):
  """The port's outputs with the Linen model's values converted through
  `mapping`, beside the original's, on the example inputs and on inputs
  inference never saw, the gradients of both with respect to the floating
  inputs, and the outputs in training (dropout masks drawn alike): a check
  that shares nothing with inference."""
  variables = jax.jit(case.linen.init)(jax.random.key(1), *case.inputs)
  port = linen_to_nnx(variables, target=case.make_nnx(nnx.Rngs(0)), paths=mapping)
  port.eval()
  run = nnx.jit(lambda model, *inputs: model(*inputs))
  drawn = [case.inputs, unseen(case, 0), unseen(case, 1)]
  ported = [np.asarray(run(port, *inputs)) for inputs in drawn]
  original = [np.asarray(jax.jit(case.linen.apply)(variables, *inputs)) for inputs in drawn]
  # Backward: the gradient of a fixed projection with respect to each floating input.
  floats = [k for k, x in enumerate(case.inputs) if jnp.issubdtype(x.dtype, jnp.floating)]
  weights = jax.random.normal(jax.random.key(3), np.shape(original[0]))

  def input_gradients(f, inputs):
    def projected(chosen):
      given = list(inputs)
      for k, v in zip(floats, chosen):
        given[k] = v
      return jnp.sum(f(*given) * weights)
    return [np.asarray(g) for g in jax.grad(projected)([inputs[k] for k in floats])]

  ported += input_gradients(lambda *xs: port(*xs), drawn[1])
  original += input_gradients(lambda *xs: case.linen.apply(variables, *xs), drawn[1])
  # In training, where the model has a mode: the port after .train(), Linen with its train flag.
  if 'train' not in inspect.signature(type(case.linen).__call__).parameters:
    return ported, original
  train = {'train': True}
  port.train()
  for inputs in drawn[1:]:
    with masks_in_call_order():
      ported.append(np.asarray(port(*inputs)))
    with masks_in_call_order():
      original.append(np.asarray(case.linen.apply(
          variables, *inputs, rngs={'dropout': jax.random.key(2)}, **train)))
  return ported, original


# Nightly besides the cases CI_EVERY_NTH leaves out, two of CI's slowest:
# constant tokens made generic (test_witness' test_inputs_made_generic_keep_what_their_values_mean,
# test_a_symmetric_example_input_hides_no_transpose) and a table looked up and
# attended (test_infer's test_a_table_sliced_or_looked_up_at_a_range_and_dead_code_map_alike).
_NIGHTLY = (
    'attention_kept_out_in_on_constant_tokens', 'embedding_indexed_or_taken_and_attended',
    # CI: test_infer.py::test_a_given_rule_wins_and_inference_fills_only_what_it_leaves (an (out, in)
    # kernel used as `x @ w.T`, inferred with its transpose and proven by outputs).
    'rectangular_kernel_kept_out_in', 'square_kernel_transposed_in_the_call',
)


@pytest.mark.parametrize('name', [
    pytest.param(name, marks=pytest.mark.nightly) if name in _NIGHTLY else name for name in sorted(CASES)
])
def test_a_port_maps_correctly_or_is_refused_never_wrong(name):
  case = CASES[name]
  with case.context():
    try:
      port = case.make_nnx(nnx.Rngs(0))
      port.eval()  # the mode the example inputs run in, as infer_paths asks
      mapping = infer_paths(case.linen, port, *case.inputs)
    except PathMappingError as e:
      assert case.expect != 'maps', f'refused a port that should map: {e}'
      assert type(e) is case.expect, f'refused as {type(e).__name__}, not {case.expect.__name__}: {e}'
      assert all(n in str(e) for n in case.names), str(e)
      return
    assert case.expect == 'maps', f'mapped a port that should be refused: {mapping}'
    port, original = outputs_through(mapping, case)
  for ported, expected in zip(port, original):
    np.testing.assert_allclose(ported, expected, rtol=1e-6, atol=1e-6)


def test_a_selector_given_as_a_keyword_input_is_drawn_both_ways_as_a_positional_one():
  from tests.converters.inference.ports import LinenKeep, NNXKeep

  port = NNXKeep(nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (2, 4))
  # An all-true mask makes the two kernels alike; drawn anew, it tells them apart.
  mapping = infer_paths(LinenKeep(), port, x, keep=jnp.ones((2, 4), bool))
  assert {(r.linen, r.nnx) for r in mapping.rules} == {('main/kernel', 'a/kernel'), ('branch/kernel', 'b/kernel')}


def test_a_selector_that_is_no_array_is_a_constant_the_witness_cannot_vary():
  from converters import LinenModel
  from tests.converters.inference.ports import LinenKeep, NNXKeep

  class KeepByDefault(NNXKeep):
    def __call__(self, x, keep=True):
      return super().__call__(x, keep)

  x = jax.random.normal(jax.random.key(0), (2, 4))
  # Given to both calls, as a LinenModel's setting (the port's default), or as each side's own.
  attempts = [
      lambda: infer_paths(LinenKeep(), NNXKeep(nnx.Rngs(0)), x, keep=True),
      lambda: infer_paths(LinenModel(LinenKeep(), x, keep=True), KeepByDefault(nnx.Rngs(0))),
      lambda: infer_paths(LinenKeep(), NNXKeep(nnx.Rngs(0)), x, linen_kwargs={'keep': True},
                          nnx_kwargs={'keep': True}),
  ]
  for attempt in attempts:
    with pytest.raises(PathMappingError, match=r'keyword arguments \(keep\) are not arrays'):
      attempt()


def test_a_port_that_cannot_be_differentiated_maps_or_is_refused_never_crashes():
  from flax import linen as nn

  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      y = nn.Dense(4, name='a')(x) + nn.Dense(4, name='b')(x)
      for _ in range(3):
        y = jnp.tanh(y)
      return y

  class Port(nnx.Module):
    def __init__(self, rngs):
      self.q, self.p = nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
      y = self.q(x) + self.p(x)
      return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.tanh(c[1])), (0, y))[1]

  x = jax.random.normal(jax.random.key(0), (2, 4))
  try:  # no run backward through the port's while_loop: decided without it
    mapping = infer_paths(Linen(), Port(nnx.Rngs(0)), x)
  except PathMappingError as e:
    assert 'a/kernel' in str(e)
    return
  variables = Linen().init(jax.random.key(1), x)
  port = linen_to_nnx(variables, target=Port(nnx.Rngs(0)), paths=mapping)
  np.testing.assert_allclose(port(-3 * x), Linen().apply(variables, -3 * x), rtol=1e-6, atol=1e-6)
