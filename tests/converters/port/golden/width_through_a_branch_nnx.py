"""NNX port of `tests.converters.port.golden.width_through_a_branch`, written by
`linen-nnx port tests.converters.port.golden.width_through_a_branch:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`width_through_a_branch_nnx_paths.PATHS`, written beside this file, maps the
Linen variables onto these modules (`linen-nnx convert --paths
width_through_a_branch_nnx_paths:PATHS`). Proven equivalent when written: see
`test_width_through_a_branch_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Residual(nnx.Module):

  def __init__(self, out_dim: int | None = None, *, in_features: int, rngs: nnx.Rngs):
    self.out_dim = out_dim
    if out_dim is not None:
      self.projection = nnx.Linear(in_features, out_dim, rngs=rngs)
    self.block = nnx.Linear(
        out_dim if out_dim is not None else in_features,
        out_dim if out_dim is not None else in_features,
        rngs=rngs,
    )
    self.head = nnx.Linear(out_dim if out_dim is not None else in_features, 3, rngs=rngs)

  def __call__(self, x):
    if self.out_dim is not None:
      x = self.projection(x)
    x = x + nnx.gelu(self.block(x))
    return self.head(x)
