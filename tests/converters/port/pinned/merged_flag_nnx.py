"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:merged_flag`.

Each class is the NNX counterpart of the Linen class of the same name;
`merged_flag_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
merged_flag_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import linen as nn
from flax import nnx


class MergedFlag(nnx.Module):
  """Flax's sst2 way of taking a flag from the field or the call
  (`nn.module.merge_param`): kept as it is, a function of Python values."""

  def __init__(self, plain: bool | None = None, *, in_features: int, rngs: nnx.Rngs):
    self.plain = plain
    self.dense = nnx.Linear(in_features, 3, rngs=rngs)

  def __call__(self, x, plain: bool | None = None):
    plain = nn.module.merge_param('plain', self.plain, plain)
    x = self.dense(x)
    return x if plain else x * 2
