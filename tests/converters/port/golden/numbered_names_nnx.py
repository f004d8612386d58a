"""NNX port of `tests.converters.port.golden.numbered_names`, written by
`linen-nnx port tests.converters.port.golden.numbered_names:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`numbered_names_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
numbered_names_nnx_paths:PATHS`). Proven equivalent when written: see
`test_numbered_names_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Block(nnx.Module):

  def __init__(self, width: int, *, rngs: nnx.Rngs):
    self.proj = nnx.Linear(width, width, rngs=rngs)

  def __call__(self, x):
    return x + self.proj(nnx.relu(x))


class Net(nnx.Module):

  def __init__(self, depth: int = 3, width: int = 8, *, in_features: int, rngs: nnx.Rngs):
    self.stem = nnx.Linear(in_features, width, rngs=rngs)
    self.blocks = nnx.List()
    for i in range(depth):
      self.blocks.append(Block(width, rngs=rngs))
    self.layers = nnx.List()
    in_size = width
    for i in range(2):
      self.layers.append(nnx.Linear(in_size, width, rngs=rngs))
      in_size = width
    self.head = nnx.Linear(in_size, 2, rngs=rngs)

  def __call__(self, x):
    x = self.stem(x)
    for block in self.blocks:
      x = block(x)
    for layer in self.layers:
      x = layer(x)
    return self.head(x)
