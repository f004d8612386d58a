"""Classes of another of the user's modules, created through it
(`layers.Block(...)`, as scenic's `nn_layers.IdentityLayer()`): written
beside the rest and created by their own names."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel
from tests.converters.port.golden import _layers as layers


class Net(nn.Module):
  width: int = 8

  @nn.compact
  def __call__(self, x):
    x = layers.Block(self.width)(x)
    return layers.Scale()(x)


def model(width: int = 8) -> LinenModel:
  return LinenModel(Net(width), jnp.ones((2, 5)))
