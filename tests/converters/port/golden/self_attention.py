"""Self-attention called with its input twice, `attn(y, y)`, as ViT,
big_vision and DiT write it, in blocks made in a loop: NNX's
`nnx.MultiHeadAttention` called as Linen's was."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class ViTBlock(nn.Module):
  heads: int = 2
  mlp: int = 12

  @nn.compact
  def __call__(self, x):
    y = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(y, y)
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.mlp)(nn.LayerNorm()(x))))


class ViTStack(nn.Module):
  depth: int = 2
  heads: int = 2

  @nn.compact
  def __call__(self, x):
    for _ in range(self.depth):
      x = ViTBlock(self.heads)(x)
    return x


def model(depth: int = 2) -> LinenModel:
  return LinenModel(ViTStack(depth), jnp.ones((2, 5, 8)))
