"""Linen's names imported bare, as some codebases write them: the
decorator, the base class, layers, activations and initializers."""

import jax.numpy as jnp
import flax.linen as linen
from flax.linen import Conv, Dense, LayerNorm, Module, compact, relu
from flax.linen.initializers import zeros as zeros_init

from converters import LinenModel


class Block(Module):
  """A convolution and a norm around a residual, initialised at zero."""

  features: int = 8

  @compact
  def __call__(self, x):
    y = Conv(self.features, (3, 3), bias_init=zeros_init)(x)
    y = LayerNorm()(relu(y))
    return x + linen.gelu(y)


class Net(Module):
  features: int = 8
  classes: int = 10

  @compact
  def __call__(self, x):
    x = Conv(self.features, (3, 3))(x)
    x = Block(self.features)(x)
    x = x.reshape((x.shape[0], -1))
    return Dense(self.classes)(x)


def model(features: int = 8) -> LinenModel:
  return LinenModel(Net(features), jnp.ones((2, 8, 8, 3)))
