"""A layer sized from its input (`nn.Dense(x.shape[-1])`, a residual
block's) after a projection a field left None skips: its width is that
field's where it is given, the input's where not, as the `if` before it
decides."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Residual(nn.Module):
  out_dim: int | None = None

  @nn.compact
  def __call__(self, x):
    if self.out_dim is not None:
      x = nn.Dense(self.out_dim, name='projection')(x)
    x = x + nn.gelu(nn.Dense(x.shape[-1], name='block')(x))
    return nn.Dense(3, name='head')(x)


def model() -> LinenModel:
  return LinenModel(Residual(), jnp.ones((2, 5)))
