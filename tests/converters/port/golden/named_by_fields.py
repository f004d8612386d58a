"""Gemma's naming: a parameter named by a field (`self.param(self.weight_name,
...)` in its `Einsum`) and the blocks of a `setup()` list named by a
comprehension (`name=f'layer_{i}'`): the parameter is the NNX attribute the
field names (`setattr(self, weight_name, ...)`), the blocks an `nnx.List`
whose entries `PATHS` maps from `layer_{i}`."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Einsum(nn.Module):
  """A parameterized tensor product."""

  shape: tuple[int, ...]
  weight_name: str = 'w'

  @nn.compact
  def __call__(self, eqn: str, x):
    w = self.param(self.weight_name, nn.initializers.normal(), self.shape)
    return jnp.einsum(eqn, x, w)


class Block(nn.Module):
  features: int
  hidden: int

  @nn.compact
  def __call__(self, x):
    h = Einsum((self.features, self.hidden), weight_name='gating')('...F,FH->...H', x)
    return x + Einsum((self.hidden, self.features))('...H,HF->...F', nn.gelu(h))


class Stack(nn.Module):
  num_layers: int = 2
  features: int = 4
  hidden: int = 8

  def setup(self):
    self.blocks = [Block(self.features, self.hidden, name=f'layer_{i}') for i in range(self.num_layers)]

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x


def model() -> LinenModel:
  return LinenModel(Stack(), jnp.ones((2, 3, 4)))
