"""A small CNN classifier in Flax Linen, in the style of Flax's MNIST example.

Convolutions with biases, ReLU and average pooling, then a hidden dense layer,
dropout and the logits. No sharding annotations. Submodules keep Linen's
automatic names (`Conv_0`, `Dense_0`, ...), as most Linen code does.
"""

from __future__ import annotations

import jax
from flax import linen as nn

from model_zoo.configs import CNNConfig


# [side-by-side: dropout]
class CNN(nn.Module):
  """`__call__(x, train)` maps NHWC images to logits; dropout is active only with `train=True`."""

  config: CNNConfig

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    config = self.config
    for features in config.features:
      x = nn.Conv(features, kernel_size=(3, 3))(x)
      x = nn.relu(x)
      x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(config.hidden)(x)
    x = nn.relu(x)
    x = nn.Dropout(config.dropout_rate, deterministic=not train)(x)
    return nn.Dense(config.num_classes)(x)
# [/side-by-side]


# [side-by-side: dropout]
def create(config: CNNConfig, images: jax.Array, seed: int = 0) -> tuple[CNN, dict]:
  """A CNN and its variables; `init` needs only the `params` stream (dropout off)."""
  model = CNN(config)
  return model, model.init({'params': jax.random.key(seed)}, images, train=False)


def train_logits(model: CNN, variables, images: jax.Array, dropout_key: jax.Array) -> jax.Array:
  """Logits with dropout on: its masks come from `dropout_key` (the same key, the same masks)."""
  return model.apply(variables, images, train=True, rngs={'dropout': dropout_key})
# [/side-by-side]
