"""NNX port of `tests.converters.port.golden.left_none`, written by `linen-nnx
port tests.converters.port.golden.left_none:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`left_none_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths left_none_nnx_paths:PATHS`).
Proven equivalent when written: see `test_left_none_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class MlpBlock(nnx.Module):

  def __init__(self, mlp_dim: int | None = None, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(in_features, mlp_dim or 4 * in_features, rngs=rngs)
    self.dense_1 = nnx.Linear(self.dense_0.out_features, in_features, rngs=rngs)

  def __call__(self, x):
    x = self.dense_0(x)
    x = nnx.gelu(x)
    return self.dense_1(x)
