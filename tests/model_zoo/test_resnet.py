"""The Linen ResNet and its NNX port agree in evaluation and over train steps with BatchNorm."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from model_zoo import paths
from model_zoo.configs import ResNetConfig
from model_zoo.linen import resnet as linen_resnet
from model_zoo.nnx import resnet as nnx_resnet
from tests.model_zoo.helpers import (
    assert_same_values,
    copy_linen_to_nnx,
    linen_flat,
    nnx_flat,
)

CONFIG = ResNetConfig(in_channels=3, stage_sizes=(2, 1), num_filters=4, num_classes=5)
FORWARD = nnx.jit(lambda model, x: model(x))


def _batch(size: int = 6) -> dict[str, jax.Array]:
  image_key, label_key = jax.random.split(jax.random.key(1))
  return {
      'image': jax.random.normal(image_key, (size, 8, 8, CONFIG.in_channels)) * 2.0 + 0.5,
      'label': jax.random.randint(label_key, (size,), 0, CONFIG.num_classes),
  }


@functools.cache
def _linen():
  model = linen_resnet.ResNet(CONFIG)
  init = jax.jit(functools.partial(model.init, train=False))
  variables = init(jax.random.key(0), _batch()['image'])
  # Running averages that are not the initial zeros and ones, so that
  # evaluation and the momentum update read real values.
  stats_key = jax.random.key(5)
  batch_stats = jax.tree.map(
      lambda s: s + 0.1 * jnp.abs(jax.random.normal(stats_key, s.shape)), variables['batch_stats']
  )
  return model, {'params': variables['params'], 'batch_stats': batch_stats}


@functools.cache
def _linen_apply(train: bool):
  model, _ = _linen()
  if train:
    return jax.jit(functools.partial(model.apply, train=True, mutable=['batch_stats']))
  return jax.jit(functools.partial(model.apply, train=False))


@functools.cache
def _created() -> nnx_resnet.ResNet:
  return nnx_resnet.ResNet(CONFIG, rngs=nnx.Rngs(2))


def _ported() -> nnx_resnet.ResNet:
  """A fresh NNX ResNet holding the Linen ResNet's parameters and batch statistics."""
  model = nnx.clone(_created())
  copy_linen_to_nnx(_linen()[1], model, paths.RESNET, count=CONFIG.num_blocks)
  return model


def test_the_projection_shortcut_exists_where_the_shape_changes():
  linen = linen_flat(_linen()[1], 'params')
  assert 'ResNetBlock_2/conv_proj/kernel' in linen
  assert not any(p.startswith(('ResNetBlock_0/conv_proj', 'ResNetBlock_1/conv_proj')) for p in linen)
  model = _created()
  assert 'blocks/2/conv_proj/kernel' in nnx_flat(model, nnx.Param)
  assert model.blocks[0].conv_proj is None


def test_eval_logits_are_bit_identical():
  _, variables = _linen()
  x = _batch()['image']
  model = _ported()
  model.eval()
  actual = FORWARD(model, x)
  assert actual.shape == (6, CONFIG.num_classes)
  np.testing.assert_array_equal(actual, _linen_apply(False)(variables, x))
  assert_same_values(variables, model, paths.RESNET, CONFIG.num_blocks)  # eval left the stats


@pytest.mark.nightly  # CI: test_zoo_ports.py::test_resnet_train_state_with_batch_stats_trains_on_in_nnx_exactly (train-mode steps and batch_stats, bit for bit)
def test_train_mode_uses_batch_statistics_and_updates_the_running_averages():
  _, variables = _linen()
  x = _batch()['image']
  model = _ported()
  model.eval()
  evaluated = FORWARD(model, x)
  model.train()
  trained = FORWARD(model, x)
  assert not np.allclose(evaluated, trained)
  linen_trained, updates = _linen_apply(True)(variables, x)
  np.testing.assert_array_equal(trained, linen_trained)
  for path, stat in linen_flat(updates, 'batch_stats').items():
    assert not np.allclose(stat, linen_flat(variables, 'batch_stats')[path]), path
  assert_same_values({**variables, **updates}, model, paths.RESNET, CONFIG.num_blocks)


# Nightly; CI: test_zoo_ports' test_resnet_train_state_with_batch_stats_trains_on_in_nnx_exactly
# (the same steps, bit for bit)
@pytest.mark.nightly
def test_adam_train_steps_give_the_same_params_batch_stats_and_losses():
  steps, batch = 2, _batch()
  linen_model, variables = _linen()
  tx = optax.adam(1e-2)
  state = linen_resnet.TrainState.create(
      apply_fn=linen_model.apply,
      params=variables['params'],
      tx=tx,
      batch_stats=variables['batch_stats'],
  )
  model = _ported()
  model.train()
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  linen_step, nnx_step = jax.jit(linen_resnet.train_step), nnx.jit(nnx_resnet.train_step)
  for _ in range(steps):
    state, linen_loss = linen_step(state, batch)
    nnx_loss = nnx_step(model, optimizer, batch)
    np.testing.assert_array_equal(nnx_loss, linen_loss)
  new = {'params': state.params, 'batch_stats': state.batch_stats}
  # The steps changed every parameter and running average...
  for collection in new:
    for path, value in linen_flat(new, collection).items():
      assert not np.array_equal(value, linen_flat(variables, collection)[path]), path
  # ...to the same values on both sides.
  assert_same_values(new, model, paths.RESNET, CONFIG.num_blocks)
  assert int(optimizer.step[...]) == int(state.step) == steps
