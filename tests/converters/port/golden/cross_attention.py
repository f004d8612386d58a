"""Self-attention, then cross-attention over an encoder's outputs of another
width: the keys' width is NNX's `in_kv_features`, read from that input."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class CrossDecoderBlock(nn.Module):
  heads: int = 2

  @nn.compact
  def __call__(self, x, encoded):
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(x)
    return x + nn.MultiHeadDotProductAttention(num_heads=self.heads, name='cross')(nn.LayerNorm()(x), encoded)


def model(heads: int = 2) -> LinenModel:
  return LinenModel(CrossDecoderBlock(heads), jnp.ones((2, 3, 8)), jnp.ones((2, 6, 12)))
