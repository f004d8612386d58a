"""Tests of `converters.optimizer_state`'s registry: optimizers of one's own convert as the kit's do.

A user's hand-written NNX momentum optimizer (not the kit's SGD) on a model
that is not the kit's MLP: unregistered it is refused with an error that says
how to register it; registered, its state converts to and from the optax
chain it implements, bit for bit, and subclasses inherit the registration.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training.train_state import TrainState

import converters
from converters import OptimizerCorrespondence, PathMapping, PathRule, register_optimizer
from converters import optimizer_state

IN, OUT, DECAY = 8, 4, 0.9
PATHS = PathMapping([PathRule('Dense_0/kernel', 'linear/kernel'), PathRule('Dense_0/bias', 'linear/bias')])
TRACE = OptimizerCorrespondence(
    'Momentum', to_nnx={(0, 'ema'): ('trace',)}, derived_from_step=((0, 'count'),)
)


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(OUT)(x)


class NNXNet(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.linear = nnx.Linear(IN, OUT, rngs=rngs)


class Trace(nnx.Variable):
  """A momentum buffer."""


class Momentum(nnx.Pytree):
  """A user's optimizer: `optax.chain(optax.ema(DECAY, debias=False), optax.scale(-lr))`."""

  def __init__(self, model: nnx.Module):
    self.step = nnx.OptState(jnp.array(0, dtype=jnp.uint32))
    self.trace = nnx.data(
        jax.tree.map(
            lambda p: Trace(jnp.zeros_like(p[...])),
            nnx.state(model, nnx.Param),
            is_leaf=lambda x: isinstance(x, nnx.Variable),
        )
    )


class NesterovMomentum(Momentum):
  """A subclass: same state, so the same correspondence."""


@pytest.fixture
def registered(monkeypatch):
  """Registers `Momentum` for one test; the registry is restored after it."""
  monkeypatch.setattr(optimizer_state, '_REGISTRY', dict(optimizer_state._REGISTRY))
  register_optimizer(Momentum, TRACE)


def trained_linen_state(steps: int = 3) -> TrainState:
  x = jax.random.normal(jax.random.key(1), (2, IN))
  tx = optax.chain(optax.ema(DECAY, debias=False), optax.scale(-0.1))
  state = TrainState.create(
      apply_fn=LinenNet().apply, params=LinenNet().init(jax.random.key(0), x)['params'], tx=tx
  )
  loss = lambda params: jnp.sum(state.apply_fn({'params': params}, x) ** 2)
  train_step = jax.jit(lambda s: s.apply_gradients(grads=jax.grad(loss)(s.params)))
  for _ in range(steps):
    state = train_step(state)
  return state


def nnx_target(optimizer_type=Momentum):
  model = NNXNet(nnx.Rngs(0))
  return model, optimizer_type(model)


def test_an_unregistered_optimizer_is_refused_saying_how_to_register_it():
  with pytest.raises(converters.OptimizerStateError, match='Momentum.*register_optimizer'):
    converters.linen_to_nnx(trained_linen_state(), target=nnx_target(), paths=PATHS)


@pytest.mark.parametrize('optimizer_type', [Momentum, NesterovMomentum])
def test_a_registered_optimizer_converts_both_ways_bit_for_bit(registered, optimizer_type):
  state = trained_linen_state()
  model, optimizer = converters.linen_to_nnx(
      state, target=nnx_target(optimizer_type), paths=PATHS
  )
  ema = state.opt_state[0]
  for name in ('kernel', 'bias'):
    assert np.asarray(optimizer.trace['linear'][name][...]).tobytes() == (
        np.asarray(ema.ema['Dense_0'][name]).tobytes()
    )
    assert np.asarray(getattr(model.linear, name)[...]).tobytes() == (
        np.asarray(state.params['Dense_0'][name]).tobytes()
    )
  assert int(optimizer.step[...]) == int(state.step) == 3

  back = converters.nnx_to_linen((model, optimizer), target=state, paths=PATHS)
  assert jax.tree.structure(back) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
    assert np.asarray(a).dtype == np.asarray(b).dtype
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_an_ema_count_that_is_not_the_step_is_refused(registered):
  state = trained_linen_state()
  ema = state.opt_state[0]._replace(count=jnp.array(7, dtype=jnp.int32))
  state = state.replace(opt_state=(ema, *state.opt_state[1:]))
  with pytest.raises(converters.OptimizerStateError, match='opt_state/0/count=7 differs from step=3'):
    converters.linen_to_nnx(state, target=nnx_target(), paths=PATHS)


def test_register_optimizer_checks_its_arguments():
  with pytest.raises(TypeError, match='not a class'):
    register_optimizer(Momentum(NNXNet(nnx.Rngs(0))), TRACE)
  with pytest.raises(TypeError, match='not an OptimizerCorrespondence'):
    register_optimizer(Momentum, {(0, 'ema'): ('trace',)})
