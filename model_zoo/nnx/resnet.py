"""The small ResNet with BatchNorm ported to Flax NNX.

`nnx.BatchNorm` keeps its running averages as `nnx.BatchStat` Variables and
updates them in place when it runs in training mode (`model.train()`); in
evaluation mode (`model.eval()`) it uses them. `train_step` updates the model
and its `nnx.Optimizer` in place (jit it with `nnx.jit`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from model_zoo.configs import ResNetConfig


# [side-by-side: batch-norm]
class ResNetBlock(nnx.Module):
  """Two 3x3 convolutions with BatchNorm and a residual connection."""

  def __init__(
      self,
      config: ResNetConfig,
      in_filters: int,
      filters: int,
      strides: tuple[int, int] = (1, 1),
      *,
      rngs: nnx.Rngs,
  ):
    norm = functools.partial(
        nnx.BatchNorm, momentum=config.momentum, epsilon=config.epsilon, rngs=rngs
    )
    self.conv1 = nnx.Conv(in_filters, filters, (3, 3), strides, use_bias=False, rngs=rngs)
    self.norm1 = norm(filters)
    self.conv2 = nnx.Conv(filters, filters, (3, 3), use_bias=False, rngs=rngs)
    self.norm2 = norm(filters)
    # Linen decides on the shortcut from the shapes it sees; NNX from the sizes.
    if in_filters != filters or strides != (1, 1):
      self.conv_proj = nnx.Conv(in_filters, filters, (1, 1), strides, use_bias=False, rngs=rngs)
      self.norm_proj = norm(filters)
    else:
      self.conv_proj = self.norm_proj = None

  def __call__(self, x: jax.Array) -> jax.Array:
    residual = x
    y = self.conv1(x)
    y = self.norm1(y)
    y = nnx.relu(y)
    y = self.conv2(y)
    y = self.norm2(y)
    if self.conv_proj is not None:
      residual = self.conv_proj(residual)
      residual = self.norm_proj(residual)
    return nnx.relu(residual + y)
# [/side-by-side]


class ResNet(nnx.Module):
  """Stem, `config.stage_sizes` stages of `ResNetBlock`s, global mean pool, dense head."""

  def __init__(self, config: ResNetConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.conv_init = nnx.Conv(
        config.in_channels, config.num_filters, (3, 3), use_bias=False, rngs=rngs
    )
    self.bn_init = nnx.BatchNorm(
        config.num_filters, momentum=config.momentum, epsilon=config.epsilon, rngs=rngs
    )
    blocks, in_filters = [], config.num_filters
    for i, num_blocks in enumerate(config.stage_sizes):
      for j in range(num_blocks):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        filters = config.num_filters * 2**i
        blocks.append(ResNetBlock(config, in_filters, filters, strides, rngs=rngs))
        in_filters = filters
    self.blocks = nnx.List(blocks)
    self.head = nnx.Linear(in_filters, config.num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = self.conv_init(x)
    x = self.bn_init(x)
    x = nnx.relu(x)
    for block in self.blocks:
      x = block(x)
    x = jnp.mean(x, axis=(1, 2))
    return self.head(x)


# [side-by-side: batch-stats-step]
# NNX has no TrainState: the model holds its parameters and batch statistics,
# and `nnx.Optimizer(model, tx, wrt=nnx.Param)` holds the step and optax state.
# [/side-by-side]


# [side-by-side: batch-stats-step]
def train_step(model: ResNet, optimizer: nnx.Optimizer, batch: dict[str, jax.Array]) -> jax.Array:
  """One step on `batch` (`'image'`, integer `'label'`), in place: returns the loss.

  The model must be in training mode (`model.train()`), so that BatchNorm uses
  the batch statistics and updates its running averages.
  """

  def loss_fn(model: ResNet):
    logits = model(batch['image'])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).mean()

  # Gradients of the `nnx.Param`s only (the default); the BatchStat updates
  # made during the forward pass are written back to `model`.
  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss
# [/side-by-side]
