"""NNX port of `tests.converters.port.golden.self_attention`, written by
`linen-nnx port tests.converters.port.golden.self_attention:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`self_attention_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
self_attention_nnx_paths:PATHS`). Proven equivalent when written: see
`test_self_attention_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class ViTBlock(nnx.Module):

  def __init__(self, heads: int = 2, mlp: int = 12, *, in_features: int, rngs: nnx.Rngs):
    self.layer_norm_0 = nnx.LayerNorm(in_features, rngs=rngs)
    self.multi_head_dot_product_attention = nnx.MultiHeadAttention(
        num_heads=heads,
        in_features=in_features,
        decode=False,
        rngs=rngs,
    )
    self.dense_0 = nnx.Linear(mlp, in_features, rngs=rngs)
    self.dense_1 = nnx.Linear(in_features, mlp, rngs=rngs)
    self.layer_norm_1 = nnx.LayerNorm(in_features, rngs=rngs)

  def __call__(self, x):
    y = self.layer_norm_0(x)
    x = x + self.multi_head_dot_product_attention(y, y)
    return x + self.dense_0(nnx.gelu(self.dense_1(self.layer_norm_1(x))))


class ViTStack(nnx.Module):

  def __init__(self, depth: int = 2, heads: int = 2, *, in_features: int, rngs: nnx.Rngs):
    self.vit_blocks = nnx.List()
    for _ in range(depth):
      self.vit_blocks.append(ViTBlock(heads, in_features=in_features, rngs=rngs))

  def __call__(self, x):
    for vit_block in self.vit_blocks:
      x = vit_block(x)
    return x
