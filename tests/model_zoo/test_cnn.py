"""The Linen CNN and its NNX port compute the same logits from the same parameters."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from model_zoo import paths
from model_zoo.configs import CNNConfig
from model_zoo.linen import cnn as linen_cnn
from model_zoo.nnx import cnn as nnx_cnn
from tests.model_zoo.helpers import copy_linen_to_nnx

CONFIG = CNNConfig(image_size=8, in_channels=3, features=(4, 8, 8), hidden=16, num_classes=10)
FORWARD = nnx.jit(lambda model, x: model(x))


def _images(config: CNNConfig, batch: int = 4) -> jax.Array:
  shape = (batch, config.image_size, config.image_size, config.in_channels)
  return jax.random.normal(jax.random.key(1), shape)


@functools.cache
def _linen(config: CNNConfig):
  model = linen_cnn.CNN(config)
  init = jax.jit(functools.partial(model.init, train=False))
  return model, init(jax.random.key(0), _images(config))


@functools.cache
def _linen_apply(config: CNNConfig, train: bool):
  model, _ = _linen(config)
  return jax.jit(functools.partial(model.apply, train=train))


@functools.cache
def _created(config: CNNConfig) -> nnx_cnn.CNN:
  return nnx_cnn.CNN(config, rngs=nnx.Rngs(params=2, dropout=3))


def _ported(config: CNNConfig) -> nnx_cnn.CNN:
  """A fresh NNX CNN holding the Linen CNN's parameters."""
  model = nnx.clone(_created(config))
  copied = copy_linen_to_nnx(_linen(config)[1], model, paths.CNN, count=len(config.features))
  assert copied == 2 * len(config.features) + 4
  return model


def test_eval_logits_are_bit_identical():
  config = CONFIG
  x = _images(config)
  expected = _linen_apply(config, False)(_linen(config)[1], x)
  model = _ported(config)
  model.eval()
  actual = FORWARD(model, x)
  assert actual.shape == (4, config.num_classes)
  np.testing.assert_array_equal(actual, expected)


def test_copy_really_moves_the_parameters():
  x = _images(CONFIG)
  fresh = nnx.clone(_created(CONFIG))
  fresh.eval()
  assert not np.allclose(FORWARD(fresh, x), _linen_apply(CONFIG, False)(_linen(CONFIG)[1], x))


@pytest.mark.nightly  # CI: test_side_by_side_claims.py's dropout claims on the zoo CNN (test_nnx_dropout_draws_from_its_rngs_stream, test_linen_dropout_needs_a_dropout_rng, test_nnx_train_and_eval_set_every_dropout)
def test_dropout_is_on_in_training_and_off_in_evaluation():
  x, variables = _images(CONFIG), _linen(CONFIG)[1]
  evaluated = _linen_apply(CONFIG, False)(variables, x)
  trained = _linen_apply(CONFIG, True)(variables, x, rngs={'dropout': jax.random.key(4)})
  assert not np.allclose(trained, evaluated)
  model = _ported(CONFIG)
  model.train()
  first, second = FORWARD(model, x), FORWARD(model, x)
  assert not np.allclose(first, second)  # a new mask per call
  model.eval()
  np.testing.assert_array_equal(FORWARD(model, x), evaluated)
