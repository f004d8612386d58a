"""A small ResNet with BatchNorm in Flax Linen, in the style of Flax's ImageNet example.

`BatchNorm(use_running_average=not train)`: in training it normalises with the
batch statistics and updates the running averages in the `batch_stats`
collection, so `apply` must be called with `mutable=['batch_stats']`; in
evaluation it uses the running averages. `TrainState` carries `batch_stats`
beside the parameters and `train_step` is a pure function of it (jit it with
`jax.jit`).

The stem and the projection shortcut are named explicitly, as in Flax's
example; the convolutions and norms inside a block keep their automatic names.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax.training import train_state

from model_zoo.configs import ResNetConfig


# [side-by-side: batch-norm]
class ResNetBlock(nn.Module):
  """Two 3x3 convolutions with BatchNorm and a residual connection."""

  config: ResNetConfig
  filters: int
  strides: tuple[int, int] = (1, 1)

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    norm = functools.partial(
        nn.BatchNorm,
        use_running_average=not train,
        momentum=self.config.momentum,
        epsilon=self.config.epsilon,
    )
    residual = x
    y = nn.Conv(self.filters, (3, 3), self.strides, use_bias=False)(x)
    y = norm()(y)
    y = nn.relu(y)
    y = nn.Conv(self.filters, (3, 3), use_bias=False)(y)
    y = norm()(y)
    if residual.shape != y.shape:
      residual = nn.Conv(
          self.filters, (1, 1), self.strides, use_bias=False, name='conv_proj'
      )(residual)
      residual = norm(name='norm_proj')(residual)
    return nn.relu(residual + y)
# [/side-by-side]


class ResNet(nn.Module):
  """Stem, `config.stage_sizes` stages of `ResNetBlock`s, global mean pool, dense head."""

  config: ResNetConfig

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    config = self.config
    x = nn.Conv(config.num_filters, (3, 3), use_bias=False, name='conv_init')(x)
    x = nn.BatchNorm(
        use_running_average=not train,
        momentum=config.momentum,
        epsilon=config.epsilon,
        name='bn_init',
    )(x)
    x = nn.relu(x)
    for i, num_blocks in enumerate(config.stage_sizes):
      for j in range(num_blocks):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = ResNetBlock(config, config.num_filters * 2**i, strides)(x, train)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(config.num_classes, name='head')(x)


# [side-by-side: batch-stats-step]
class TrainState(train_state.TrainState):
  """Flax's `TrainState` with the BatchNorm running averages beside the parameters."""

  batch_stats: Any
# [/side-by-side]


# [side-by-side: batch-stats-step]
def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, jax.Array]:
  """One step on `batch` (`'image'`, integer `'label'`): returns the new state and the loss."""

  def loss_fn(params):
    logits, updates = state.apply_fn(
        {'params': params, 'batch_stats': state.batch_stats},
        batch['image'],
        train=True,
        mutable=['batch_stats'],
    )
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).mean()
    return loss, updates

  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads, batch_stats=updates['batch_stats'])
  return state, loss
# [/side-by-side]
