"""NNX port of `tests.converters.port.golden.if_expression_in_a_loop`, written by
`linen-nnx port tests.converters.port.golden.if_expression_in_a_loop:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`if_expression_in_a_loop_nnx_paths.PATHS`, written beside this file, maps the
Linen variables onto these modules (`linen-nnx convert --paths
if_expression_in_a_loop_nnx_paths:PATHS`). Proven equivalent when written: see
`test_if_expression_in_a_loop_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Repeated(nnx.Module):

  def __init__(self, out_dim: int | None = 5, n: int = 2, *, in_features: int, rngs: nnx.Rngs):
    self.out_dim = out_dim
    self.n = n
    self.denses = nnx.List()
    for _ in range(n):
      if out_dim is not None:
        self.denses.append(nnx.Linear(in_features, out_dim, rngs=rngs))
        in_features = out_dim

  def __call__(self, x):
    denses_iter = iter(self.denses)
    for _ in range(self.n):
      x = next(denses_iter)(x) if self.out_dim is not None else x * 2
    return x
