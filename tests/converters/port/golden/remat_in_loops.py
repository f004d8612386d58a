"""Modules under `nn.remat` called in loops: two statements of one loop
calling one rematerialised class with other arguments (a function each,
both written before the loop, named apart), and an argument read off the
loop passed to the function beside one closed over that the parameter must
not shadow (`b`)."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, scale=1.0):
    return nn.Dense(x.shape[-1])(x) * scale


class Mix(nn.Module):
  @nn.compact
  def __call__(self, x, a, b):
    return nn.Dense(x.shape[-1])(x) * a + b


class Encoder(nn.Module):
  depth: int = 2

  @nn.compact
  def __call__(self, x):
    block = nn.remat(Block)
    for i in range(self.depth):
      x = block(name=f'scaled_{i}')(x, 2.0)
      x = block(name=f'plain_{i}')(x)
    b = 0.5
    for i in range(self.depth):
      x = nn.remat(Mix)(name=f'mix_{i}')(x, b, i * 1.0)
    return x


def model() -> LinenModel:
  return LinenModel(Encoder(), jnp.ones((2, 4)))
