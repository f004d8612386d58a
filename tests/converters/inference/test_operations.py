"""Operations compiled ahead: the bits of `primitive.bind`, one compilation per
distinct operation (primitive, parameters, operand shapes, literal values),
whatever the thread that compiled it."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from converters.inference.evaluation import Program
from converters.inference.operations import Literal, Operations, signature


def steps(f, *avals):
  program = Program.of(jax.make_jaxpr(f)(*avals))
  return [(step.eqn, step.operands) for step in program.steps]


def bound(eqn, operands, values):
  outs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
  return list(outs) if eqn.primitive.multiple_results else [outs]


X = jax.ShapeDtypeStruct((8, 16), jnp.float32)
W = jax.ShapeDtypeStruct((16, 32), jnp.float32)


def block(x, w):
  h = jnp.tanh(x @ w * 0.5 + 1.0)
  top, where = jax.lax.top_k(h, 3)  # several results
  return jnp.sum(h, axis=-1), top, where, jnp.argmax(h, axis=0)


def test_each_operation_computes_the_bits_bind_computes():
  operations = Operations()
  program = steps(block, X, W)
  operations.prepare(e for e, _ in program)
  rng = np.random.default_rng(0)
  for eqn, operands in program:
    values = [
        o.value if isinstance(o, Literal) else jnp.asarray(rng.standard_normal(v.aval.shape), v.aval.dtype)
        for v, o in zip(eqn.invars, operands)
    ]
    for got, expected in zip(operations.apply(eqn, values), bound(eqn, operands, values),
                             strict=True):
      assert got.dtype == expected.dtype and got.shape == expected.shape
      np.testing.assert_array_equal(got, expected)


def test_an_operation_is_compiled_once_however_often_it_appears():
  operations = Operations()
  program = steps(lambda x, w: jnp.tanh(jnp.tanh(x @ w) @ w.T) @ w, X, W)
  operations.prepare(e for e, _ in program)
  # dot (8,16)x(16,32) twice, (8,32)x(32,16) once, the transpose, tanh at two shapes
  assert len(operations._compiled) == len({signature(e) for e, _ in program}) == 5
  operations.prepare(e for e, _ in program)
  assert len(operations._compiled) == 5


def test_a_literal_is_an_argument_as_in_eager_bind_not_a_constant_xla_folds():
  # XLA rewrites `x ** 0.5` with a constant exponent (a square root), which
  # rounds otherwise than `pow`; eager `bind` passes the exponent at run time.
  x = jnp.abs(jax.random.normal(jax.random.key(0), (100_000,))) + 0.1
  a = steps(lambda x: x ** 0.5, jax.ShapeDtypeStruct(x.shape, x.dtype))
  b = steps(lambda x: x ** 3.0, jax.ShapeDtypeStruct(x.shape, x.dtype))
  assert signature(a[-1][0]) == signature(b[-1][0])  # one compilation for both exponents
  operations = Operations()
  for eqn, operands in (a[-1], b[-1]):
    values = [o.value if isinstance(o, Literal) else x for o in operands]
    np.testing.assert_array_equal(operations.apply(eqn, values)[0], bound(eqn, operands, values)[0])


def test_the_least_recently_used_go_first():
  operations = Operations(capacity=2)
  program = steps(lambda x: (x + 1.0, x * 2.0, x - 3.0), X)
  x = jnp.ones(X.shape)
  for eqn, operands in program:
    operations.apply(eqn, [o.value if isinstance(o, Literal) else x for o in operands])
  assert list(operations._compiled) == [signature(program[1][0]), signature(program[2][0])]


def test_an_operation_whose_parameters_cannot_be_compared_has_no_signature():
  eqn, operands = steps(lambda x: jnp.sum(x, axis=0), X)[0]
  listed = types.SimpleNamespace(**{k: getattr(eqn, k) for k in ('primitive', 'invars', 'ctx')},
                                 params={**eqn.params, 'axes': list(eqn.params['axes'])})
  assert signature(listed) is None
