"""A branch no configuration the port traces takes (a hybrid model's ResNet
root, configured by a dict the trace has not got): the class is written,
that branch raising in `__init__` and `__call__`, and proven without it."""

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Root(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.GroupNorm()(nn.Conv(self.width, (3, 3))(x)))


class Hybrid(nn.Module):
  width: int = 8
  resnet: Any = None

  @nn.compact
  def __call__(self, x):
    if self.resnet is not None:
      x = Root(self.resnet['width'])(x)
      x = nn.max_pool(x, (2, 2))
    else:
      x = x * 2
    x = nn.Conv(self.width, (2, 2), strides=(2, 2))(x)
    return nn.Dense(3)(x.mean(axis=(1, 2)))


def model(width: int = 8) -> LinenModel:
  return LinenModel(Hybrid(width), jnp.ones((2, 8, 8, 3)))
