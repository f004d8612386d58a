"""Initializers kept in a dict and spread into each layer (big_vision's
`MlpBlock`: `nn.Dense(..., **inits)`): each NNX layer is given them by
name, and the dict leaves `__call__`."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class MlpBlock(nn.Module):
  mlp_dim: int = 12

  @nn.compact
  def __call__(self, x):
    inits = dict(
        kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6),
    )
    d = x.shape[-1]
    x = nn.Dense(self.mlp_dim, **inits)(x)
    x = nn.gelu(x)
    return nn.Dense(d, **{'kernel_init': nn.initializers.zeros})(x)


def model() -> LinenModel:
  return LinenModel(MlpBlock(), jnp.ones((2, 5, 6)))
