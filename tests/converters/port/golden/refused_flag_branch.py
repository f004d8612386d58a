"""A branch only a flag the proof flips takes (`per_example=True`, as
big_vision's `Encoder` takes `scan=True`), through what the port does not
write (`nn.vmap` of a module): the class is written for the
configuration given, that branch raises `NotImplementedError` saying why,
and the flipped configuration is reported as not proven, not mapped. The
blocks are called through a local (`block_cur(x, deterministic)`), their
mode flag handed on: the NNX mode."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    return nn.Dropout(0.1)(nn.relu(nn.Dense(x.shape[-1])(x)), deterministic)


class Encoder(nn.Module):
  depth: int = 2
  per_example: bool = False

  @nn.compact
  def __call__(self, x, deterministic=True):
    if self.per_example:
      block = nn.vmap(Block, in_axes=(0, None), out_axes=0, variable_axes={'params': None},
                      split_rngs={'params': False, 'dropout': True})
      for i in range(self.depth):
        x = block(name=f'block_{i}')(x, deterministic)
    else:
      for i in range(self.depth):
        block_cur = Block(name=f'block_{i}')
        x = block_cur(x, deterministic)
    return nn.LayerNorm(name='norm')(x)


def model() -> LinenModel:
  return LinenModel(Encoder(), jnp.ones((2, 5)), deterministic=True)
