"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:sows_a_loss`.

Each class is the NNX counterpart of the Linen class of the same name;
`sows_a_loss_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
sows_a_loss_nnx_paths:PATHS`).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class Losses(nnx.Intermediate):
  """What the model sows into Linen's 'losses' collection (read it with
  `nnx.capture(model, Losses)`, as Linen with `mutable=['losses']`)."""


class SowsALoss(nnx.Module):
  """An auxiliary loss sown into a collection of its own, and an intermediate."""

  def __init__(self, features: int = 6, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(in_features, features, rngs=rngs)
    self.dense_1 = nnx.Linear(features, 2, rngs=rngs)

  def __call__(self, x):
    h = self.dense_0(x)
    self.sow(Losses, 'activity', jnp.mean(h ** 2))
    self.sow(nnx.Intermediate, 'hidden', h)
    return self.dense_1(nnx.relu(h))
