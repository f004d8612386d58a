"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:tiled_by`.

Each class is the NNX counterpart of the Linen class of the same name;
`tiled_by_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths tiled_by_nnx_paths:PATHS`).

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `train=False`, `model.train()` to train.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class TiledBy(nnx.Module):
  """Takes a count beside its array (a Python value the code tiles by);
  `x` is bound to a layer whose mode `train` sets (not an alias of it)."""

  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.batch_norm = nnx.BatchNorm(4, rngs=rngs)
    self.dense = nnx.Linear(in_features, 4, rngs=rngs)

  def __call__(self, x, times):
    x = self.batch_norm(self.dense(x))
    return jnp.tile(x, (1, times))
