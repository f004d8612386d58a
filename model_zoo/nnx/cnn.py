"""The small CNN classifier ported to Flax NNX.

Layers are created in `__init__` with their input sizes (NNX has no shape
inference), the convolutions in an `nnx.List`. Dropout follows the module's
mode: on in a new model and after `model.train()`, off after `model.eval()`;
its masks come from the model's `nnx.Rngs` `dropout` stream.
"""

from __future__ import annotations

import jax
from flax import nnx

from model_zoo.configs import CNNConfig


# [side-by-side: dropout]
class CNN(nnx.Module):
  """`__call__(x)` maps NHWC images to logits; dropout is on until `model.eval()`."""

  def __init__(self, config: CNNConfig, *, rngs: nnx.Rngs):
    self.config = config
    in_features = (config.in_channels,) + config.features[:-1]
    self.convs = nnx.List([
        nnx.Conv(i, o, kernel_size=(3, 3), rngs=rngs)
        for i, o in zip(in_features, config.features)
    ])
    self.hidden = nnx.Linear(config.flat_features, config.hidden, rngs=rngs)
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
    self.logits = nnx.Linear(config.hidden, config.num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    for conv in self.convs:
      x = conv(x)
      x = nnx.relu(x)
      x = nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    x = self.hidden(x)
    x = nnx.relu(x)
    x = self.dropout(x)
    return self.logits(x)
# [/side-by-side]


# [side-by-side: dropout]
def create(config: CNNConfig, seed: int = 0) -> CNN:
  """A CNN whose parameters and dropout masks come from streams of one `nnx.Rngs`."""
  return CNN(config, rngs=nnx.Rngs(params=seed, dropout=seed + 1))


def train_logits(model: CNN, images: jax.Array) -> jax.Array:
  """Logits with dropout on, whatever `model`'s mode (a view, not a change of mode):
  the masks come from the model's `dropout` stream, which each call advances."""
  return nnx.view(model, deterministic=False)(images)
# [/side-by-side]
