"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:norms_none_together`.

Each class is the NNX counterpart of the Linen class of the same name;
`norms_none_together_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
norms_none_together_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class NormsNoneTogether(nnx.Module):
  """Attributes set to None together before the modules a flag makes."""

  def __init__(self, norms: bool = True, *, in_features: int, rngs: nnx.Rngs):
    self.pre = self.post = nnx.data(None)
    self.scale, self.shift = nnx.data(None), nnx.data(None)
    if norms:
      self.pre = nnx.LayerNorm(in_features, rngs=rngs)
      self.post = nnx.LayerNorm(4, rngs=rngs)
      self.scale = nnx.Linear(in_features, 4, rngs=rngs)
      self.shift = nnx.Linear(in_features, 4, rngs=rngs)

  def __call__(self, x):
    if self.pre is not None:
      x = self.post(self.scale(self.pre(x)) + self.shift(x))
    return x
