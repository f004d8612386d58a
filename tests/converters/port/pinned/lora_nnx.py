"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:lora`.

Each class is the NNX counterpart of the Linen class of the same name;
`lora_nnx_paths.PATHS`, written beside this file, maps the Linen variables onto
these modules (`linen-nnx convert --paths lora_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class LoRA(nnx.Module):
  """A dense layer keeping its kernel and bias in the module's own scope
  (`nn.share_scope`) beside the low-rank factors the module adds."""

  def __init__(self, rank: int = 2, features: int = 6, *, in_features: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(in_features, features, rngs=rngs)
    self.A = nnx.Param(nnx.initializers.normal()(rngs.params(), (in_features, rank)))
    self.B = nnx.Param(nnx.initializers.normal()(rngs.params(), (rank, features)))

  def __call__(self, x):
    dense = self.dense
    a = self.A[...]
    b = self.B[...]
    return dense(x) + x @ a @ b


class LoRAModel(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.lora = LoRA(in_features=5, rngs=rngs)
    self.dense = nnx.Linear(in_features, 5, rngs=rngs)

  def __call__(self, x):
    return self.lora(self.dense(x))
