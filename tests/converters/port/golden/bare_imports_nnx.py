"""NNX port of `tests.converters.port.golden.bare_imports`, written by `linen-nnx
port tests.converters.port.golden.bare_imports:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`bare_imports_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
bare_imports_nnx_paths:PATHS`). Proven equivalent when written: see
`test_bare_imports_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Block(nnx.Module):
  """A convolution and a norm around a residual, initialised at zero."""

  def __init__(self, features: int = 8, *, rngs: nnx.Rngs):
    self.conv = nnx.Conv(features, features, (3, 3), bias_init=nnx.initializers.zeros, rngs=rngs)
    self.layer_norm = nnx.LayerNorm(features, rngs=rngs)

  def __call__(self, x):
    y = self.conv(x)
    y = self.layer_norm(nnx.relu(y))
    return x + nnx.gelu(y)


class Net(nnx.Module):

  def __init__(self, features: int = 8, classes: int = 10, *, x_shape: tuple[int, ...], rngs: nnx.Rngs):
    self.conv = nnx.Conv(x_shape[-1], features, (3, 3), rngs=rngs)
    self.block = Block(features, rngs=rngs)
    self.dense = nnx.Linear(features * x_shape[0] * x_shape[1], classes, rngs=rngs)

  def __call__(self, x):
    x = self.conv(x)
    x = self.block(x)
    x = x.reshape((x.shape[0], -1))
    return self.dense(x)
