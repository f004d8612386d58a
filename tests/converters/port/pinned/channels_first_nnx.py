"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:channels_first`.

Each class is the NNX counterpart of the Linen class of the same name;
`channels_first_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
channels_first_nnx_paths:PATHS`).

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `train=False`, `model.train()` to train.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class ChannelsFirst(nnx.Module):
  """A BatchNorm over axis 1."""

  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.conv = nnx.Conv(in_features, 4, (3, 3), rngs=rngs)
    self.batch_norm = nnx.BatchNorm(4, axis=1, rngs=rngs)

  def __call__(self, x):
    x = self.conv(x)
    x = jnp.transpose(x, (0, 3, 1, 2))
    return self.batch_norm(x)
