"""Inputs given by keyword, as some code calls its layers: a Flax layer
(`Dense(...)(inputs=x)`), a user's block (`block(x=h)`) and a layer under
`nn.remat`. The input size each layer takes is read off the keyword."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm()(nn.Dense(x.shape[-1])(inputs=x))


class Net(nn.Module):
  features: int = 6

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.features)(inputs=x)
    h = Block()(x=h)
    return nn.remat(nn.Dense)(2)(inputs=h)


def model() -> LinenModel:
  return LinenModel(Net(), jnp.ones((2, 4)))
