"""`nn.Sequential` in a compact method: in a loop, of a user's block, a
lambda and a dropout, and named, of layers and an activation."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(self.features)(nn.LayerNorm()(x))


class Tower(nn.Module):
  depth: int = 2
  width: int = 8
  rate: float = 0.1

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(self.width)(x)
    for _ in range(self.depth):
      x = nn.Sequential([
          Block(self.width),
          lambda y: nn.gelu(y) * 2,
          nn.Dropout(self.rate, deterministic=not train),
      ])(x)
    head = nn.Sequential([nn.Dense(self.width * 2), nn.relu, nn.Dense(3)], name='head')
    return head(x)


def model(depth: int = 2, width: int = 8) -> LinenModel:
  return LinenModel(Tower(depth, width), jnp.ones((2, 5)))
