"""The Linen LSTM language model and its NNX port compute the same logits."""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from model_zoo import paths
from model_zoo.configs import RNNConfig
from model_zoo.linen import rnn as linen_rnn
from model_zoo.nnx import rnn as nnx_rnn
from tests.model_zoo.helpers import copy_linen_to_nnx, nnx_flat

CONFIG = RNNConfig()
FORWARD = nnx.jit(lambda model, tokens: model(tokens))


def _tokens() -> jax.Array:
  return jax.random.randint(jax.random.key(1), (3, 7), 0, CONFIG.vocab_size)


@functools.cache
def _linen():
  model = linen_rnn.RNNLM(CONFIG)
  return jax.jit(model.apply), jax.jit(model.init)(jax.random.key(0), _tokens())


@functools.cache
def _created() -> nnx_rnn.RNNLM:
  return nnx_rnn.RNNLM(CONFIG, rngs=nnx.Rngs(2))


def _ported() -> nnx_rnn.RNNLM:
  model = nnx.clone(_created())
  assert copy_linen_to_nnx(_linen()[1], model, paths.RNN, count=0) == len(paths.RNN['params'])
  return model


def test_logits_are_bit_identical():
  apply, variables = _linen()
  tokens = _tokens()
  actual = FORWARD(_ported(), tokens)
  assert actual.shape == (3, 7, CONFIG.vocab_size)
  np.testing.assert_array_equal(actual, apply(variables, tokens))
  assert not np.allclose(FORWARD(_created(), tokens), actual)


def test_the_recurrence_matters():
  """A token changes the logits after it, not before: the LSTM carries state."""
  apply, variables = _linen()
  tokens = _tokens()
  changed = tokens.at[:, 3].set((tokens[:, 3] + 1) % CONFIG.vocab_size)
  model = _ported()
  before, after = FORWARD(model, tokens), FORWARD(model, changed)
  np.testing.assert_array_equal(before[:, :3], after[:, :3])
  assert not np.allclose(before[:, 4:], after[:, 4:])
  np.testing.assert_array_equal(after, apply(variables, changed))


def test_nnx_rnn_keeps_an_rng_stream_linen_does_not_store():
  rng_paths = set(nnx_flat(_created(), nnx.RngState))
  assert rng_paths == {'rnn/rngs/key', 'rnn/rngs/count'}


def test_the_port_to_nnx_optimized_cell_computes_the_same_logits():
  """NNX's `OptimizedLSTMCell` holds the gates' kernels side by side."""
  apply, variables = _linen()
  tokens = _tokens()
  model = nnx_rnn.RNNLM(CONFIG, cell='optimized_lstm', rngs=nnx.Rngs(2))
  created = FORWARD(model, tokens)
  count = copy_linen_to_nnx(variables, model, paths.RNN_OPTIMIZED_CELL, count=0)
  assert count == len(paths.RNN_OPTIMIZED_CELL['params'])
  actual = FORWARD(model, tokens)
  np.testing.assert_array_equal(actual, apply(variables, tokens))
  assert not np.allclose(created, actual)
