"""`nn.Sequential` assigned in `setup()`: Linen names its layers
`body/layers_0`, NNX holds them at `body/layers/0`."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Head(nn.Module):
  hidden: int = 16
  classes: int = 4

  def setup(self):
    self.body = nn.Sequential([nn.Dense(self.hidden), nn.tanh, nn.Dense(self.classes)])

  def __call__(self, x):
    return self.body(x)


def model(hidden: int = 16) -> LinenModel:
  return LinenModel(Head(hidden), jnp.ones((2, 3)))
