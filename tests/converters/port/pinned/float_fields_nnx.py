"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:float_fields`.

Each class is the NNX counterpart of the Linen class of the same name;
`float_fields_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
float_fields_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class FloatFields(nnx.Module):
  """Floats of the configuration: a scale and a normalisation's epsilon."""

  def __init__(self, scale: float = 0.5, epsilon: float = 1e-6, *, in_features: int, rngs: nnx.Rngs):
    self.scale = scale
    self.layer_norm = nnx.LayerNorm(4, epsilon=epsilon, rngs=rngs)
    self.dense = nnx.Linear(in_features, 4, rngs=rngs)

  def __call__(self, x):
    return self.layer_norm(self.dense(x)) * self.scale
