"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:initialized_in_place`.

Each class is the NNX counterpart of the Linen class of the same name;
`initialized_in_place_nnx_paths.PATHS`, written beside this file, maps the
Linen variables onto these modules (`linen-nnx convert --paths
initialized_in_place_nnx_paths:PATHS`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class InitializedInPlace(nnx.Module):
  """An initializer written as a lambda, sizes unpacked from the input's
  shape and one of them read only by a parameter's shape: what the port
  writes of them must pass its own lint (no lambda called where it is
  written, no name unpacked and never read)."""

  def __init__(self, features: int = 6, *, in_features: int, rngs: nnx.Rngs):
    self.scale = nnx.Param(nnx.initializers.ones(rngs.params(), (in_features,)))
    self.w = nnx.Param(jax.random.normal(rngs.params(), (in_features, features)) * 0.02)
    self.b = nnx.Param(jnp.zeros((features,)))
    self.offset = nnx.Param(-(features - 2.0) * jnp.ones((features,)))

  def __call__(self, x):
    scale = self.scale[...]
    w = self.w[...]
    b = self.b[...]
    offset = self.offset[...]
    return (x * scale) @ w + b + offset
