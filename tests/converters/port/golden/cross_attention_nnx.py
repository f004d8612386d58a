"""NNX port of `tests.converters.port.golden.cross_attention`, written by
`linen-nnx port tests.converters.port.golden.cross_attention:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`cross_attention_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
cross_attention_nnx_paths:PATHS`). Proven equivalent when written: see
`test_cross_attention_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class CrossDecoderBlock(nnx.Module):

  def __init__(self, heads: int = 2, *, x_shape: tuple[int, ...], encoded_shape: tuple[int, ...], rngs: nnx.Rngs):
    self.multi_head_dot_product_attention = nnx.MultiHeadAttention(
        num_heads=heads,
        in_features=x_shape[-1],
        decode=False,
        rngs=rngs,
    )
    self.cross = nnx.MultiHeadAttention(
        num_heads=heads,
        in_features=x_shape[-1],
        in_kv_features=encoded_shape[-1],
        decode=False,
        rngs=rngs,
    )
    self.layer_norm = nnx.LayerNorm(x_shape[-1], rngs=rngs)

  def __call__(self, x, encoded):
    x = x + self.multi_head_dot_product_attention(x)
    return x + self.cross(self.layer_norm(x), encoded)
