"""`if` expressions on the configuration: a layer one makes (`x if
self.out_dim is None else nn.Dense(self.out_dim)(x)`) is made in `__init__`
under its test, and a width one decides (`x = jnp.concatenate([x, x], -1)
if self.merge == 'concat' else x` before `nn.Dense(x.shape[-1])`) is written
as it decides. (A width a flag alone decides is not: a flag's instances
share their symbolic trace, `shapes.beyond_sizes`, and the proof refuses
it.)"""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  merge: str = 'none'

  @nn.compact
  def __call__(self, x):
    x = jnp.concatenate([x, x], -1) if self.merge == 'concat' else x
    return nn.Dense(x.shape[-1])(x)


class Projected(nn.Module):
  out_dim: int | None = None

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    y = x if self.out_dim is None else nn.Dense(self.out_dim)(x)
    y = Block(merge='concat')(nn.relu(y))
    return Block()(y)


def model() -> LinenModel:
  return LinenModel(Projected(), jnp.ones((2, 5)))
