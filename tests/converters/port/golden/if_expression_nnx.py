"""NNX port of `tests.converters.port.golden.if_expression`, written by `linen-nnx
port tests.converters.port.golden.if_expression:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`if_expression_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
if_expression_nnx_paths:PATHS`). Proven equivalent when written: see
`test_if_expression_nnx_port.py`.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class Block(nnx.Module):

  def __init__(self, merge: str = 'none', *, in_features: int, rngs: nnx.Rngs):
    self.merge = merge
    self.dense = nnx.Linear(
        in_features * 2 if merge == 'concat' else in_features,
        in_features * 2 if merge == 'concat' else in_features,
        rngs=rngs,
    )

  def __call__(self, x):
    x = jnp.concatenate([x, x], -1) if self.merge == 'concat' else x
    return self.dense(x)


class Projected(nnx.Module):

  def __init__(self, out_dim: int | None = None, *, in_features: int, rngs: nnx.Rngs):
    self.out_dim = out_dim
    self.dense_0 = nnx.Linear(in_features, 8, rngs=rngs)
    if out_dim is not None:
      self.dense_1 = nnx.Linear(8, out_dim, rngs=rngs)
    self.block_0 = Block(merge='concat', in_features=8 if out_dim is None else out_dim, rngs=rngs)
    self.block_1 = Block(in_features=16 if out_dim is None else out_dim * 2, rngs=rngs)

  def __call__(self, x):
    x = self.dense_0(x)
    y = x if self.out_dim is None else self.dense_1(x)
    y = self.block_0(nnx.relu(y))
    return self.block_1(y)
