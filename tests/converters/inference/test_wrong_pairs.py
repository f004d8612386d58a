"""Ports that inference once paired wrongly with every check green, or
refused although they change nothing: each maps correctly, proven by the
outputs of the models converted through the mapping, or is refused naming
what to write; none converts wrongly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from converters import infer_paths, linen_to_nnx
from converters.errors import PathMappingError
from tests.converters.inference.ports import CASES


def outputs_through(mapping, case):
  """The port's outputs with the Linen model's values converted through
  `mapping`, beside the original's, on the example inputs and on inputs
  inference never saw: a check that shares nothing with inference."""
  variables = jax.jit(case.linen.init)(jax.random.key(1), *case.inputs)
  port = linen_to_nnx(variables, target=case.make_nnx(nnx.Rngs(0)), paths=mapping)
  unseen = [
      jax.random.normal(jax.random.key(7 + k), x.shape, x.dtype)
      if jnp.issubdtype(x.dtype, jnp.floating) else x
      for k, x in enumerate(case.inputs)
  ]
  run = nnx.jit(lambda model, *inputs: model(*inputs))
  ported = [np.asarray(run(port, *inputs)) for inputs in (case.inputs, unseen)]
  original = [np.asarray(jax.jit(case.linen.apply)(variables, *inputs)) for inputs in (case.inputs, unseen)]
  return ported, original


@pytest.mark.parametrize('name', sorted(CASES))
def test_a_port_maps_correctly_or_is_refused_never_wrong(name):
  case = CASES[name]
  with case.context():
    try:
      mapping = infer_paths(case.linen, case.make_nnx(nnx.Rngs(0)), *case.inputs)
    except PathMappingError as e:
      assert case.expect == 'refuses', f'refused a port that should map: {e}'
      assert all(n in str(e) for n in case.names), str(e)
      return
    assert case.expect == 'maps', f'mapped a port that should be refused: {mapping}'
    port, original = outputs_through(mapping, case)
  np.testing.assert_allclose(port, original, rtol=1e-6, atol=1e-6)
