"""Layers named by f-strings in loops, counting from 1 (`block{i + 1}`, as
some vision codebases name their stages) and from 0 (`layers_{i}`): one
`nnx.List` each, mapped for any depth."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(self.width, name='proj')(nn.relu(x))


class Net(nn.Module):
  depth: int = 3
  width: int = 8

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.width, name='stem')(x)
    for i in range(self.depth):
      x = Block(self.width, name=f'block{i + 1}')(x)
    for i in range(2):
      x = nn.Dense(self.width, name=f'layers_{i}')(x)
    return nn.Dense(2, name='head')(x)


def model(depth: int = 3, width: int = 8) -> LinenModel:
  return LinenModel(Net(depth, width), jnp.ones((2, 5)))
