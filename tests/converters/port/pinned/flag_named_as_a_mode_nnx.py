"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:flag_named_as_a_mode`.

Each class is the NNX counterpart of the Linen class of the same name;
`flag_named_as_a_mode_nnx_paths.PATHS`, written beside this file, maps the
Linen variables onto these modules (`linen-nnx convert --paths
flag_named_as_a_mode_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx
from flax.nnx.module import first_from


class FlagNamedAsAMode(nnx.Module):
  """A field named as NNX's modes, merged with the call's flag, that sets no
  layer's mode: kept, as NNX's layers keep theirs (`.eval()` sets it)."""

  def __init__(self, deterministic: bool | None = None, *, in_features: int, rngs: nnx.Rngs):
    self.deterministic = deterministic
    self.dense = nnx.Linear(in_features, 3, rngs=rngs)

  def __call__(self, x, deterministic: bool | None = None):
    deterministic = first_from(deterministic, self.deterministic, error_msg='deterministic: not given, nor set by model.eval()')
    return self.dense(x) * (1 if deterministic else 2)
