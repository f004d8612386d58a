"""NNX port of `tests.converters.port.golden._layers,
tests.converters.port.golden.module_attribute`, written by `linen-nnx port
tests.converters.port.golden.module_attribute:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`module_attribute_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
module_attribute_nnx_paths:PATHS`). Proven equivalent when written: see
`test_module_attribute_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Scale(nnx.Module):
  """Doubles its input: no variables."""

  def __init__(self, *, rngs: nnx.Rngs):
    pass

  def __call__(self, x):
    return x * 2


class Block(nnx.Module):

  def __init__(self, width: int, *, in_features: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(in_features, width, rngs=rngs)
    self.scale = Scale(rngs=rngs)

  def __call__(self, x):
    return self.dense(self.scale(x))


class Net(nnx.Module):

  def __init__(self, width: int = 8, *, in_features: int, rngs: nnx.Rngs):
    self.block = Block(width, in_features=in_features, rngs=rngs)
    self.scale = Scale(rngs=rngs)

  def __call__(self, x):
    x = self.block(x)
    return self.scale(x)
