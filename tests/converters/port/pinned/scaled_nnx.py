"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:scaled`.

Each class is the NNX counterpart of the Linen class of the same name;
`scaled_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths scaled_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class Scaled(nnx.Module):
  """`self.param` with a shape read from the input."""

  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.scale = nnx.Param(nnx.initializers.ones(rngs.params(), (in_features,)))
    self.dense = nnx.Linear(in_features, 2, rngs=rngs)

  def __call__(self, x):
    scale = self.scale[...]
    return self.dense(x * scale)
