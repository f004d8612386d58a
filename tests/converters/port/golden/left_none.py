"""A size a field left None switches (big_vision's `MlpBlock`: `nn.Dense(
self.mlp_dim or 4 * d)`): written as the source decides it (`mlp_dim or 4 *
in_features`), the next layer's input size read off the layer before it
(`self.dense_0.out_features`); the proof leaves `mlp_dim` None, its
default, as well as the 16 the model is given."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class MlpBlock(nn.Module):
  mlp_dim: int | None = None

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    x = nn.Dense(self.mlp_dim or 4 * d)(x)
    x = nn.gelu(x)
    return nn.Dense(d)(x)


def model(mlp_dim: int = 16) -> LinenModel:
  return LinenModel(MlpBlock(mlp_dim), jnp.ones((2, 5, 3)))
