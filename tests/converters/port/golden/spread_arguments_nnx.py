"""NNX port of `tests.converters.port.golden.spread_arguments`, written by
`linen-nnx port tests.converters.port.golden.spread_arguments:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`spread_arguments_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
spread_arguments_nnx_paths:PATHS`). Proven equivalent when written: see
`test_spread_arguments_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class MlpBlock(nnx.Module):

  def __init__(self, mlp_dim: int = 12, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(
        in_features,
        mlp_dim,
        kernel_init=nnx.initializers.xavier_uniform(),
        bias_init=nnx.initializers.normal(stddev=1e-6),
        rngs=rngs,
    )
    self.dense_1 = nnx.Linear(mlp_dim, in_features, kernel_init=nnx.initializers.zeros, rngs=rngs)

  def __call__(self, x):
    x = self.dense_0(x)
    x = nnx.gelu(x)
    return self.dense_1(x)
