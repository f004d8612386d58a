"""NNX port of `tests.converters.port.golden.remat_in_loops`, written by
`linen-nnx port tests.converters.port.golden.remat_in_loops:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`remat_in_loops_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
remat_in_loops_nnx_paths:PATHS`). Proven equivalent when written: see
`test_remat_in_loops_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Block(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(in_features, in_features, rngs=rngs)

  def __call__(self, x, scale=1.0):
    return self.dense(x) * scale


class Mix(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(in_features, in_features, rngs=rngs)

  def __call__(self, x, a, b):
    return self.dense(x) * a + b


class Encoder(nnx.Module):

  def __init__(self, depth: int = 2, *, in_features: int, rngs: nnx.Rngs):
    self.depth = depth
    self.scaleds = nnx.List()
    self.plains = nnx.List()
    for i in range(depth):
      self.scaleds.append(Block(in_features=in_features, rngs=rngs))
      self.plains.append(Block(in_features=in_features, rngs=rngs))
    self.mixs = nnx.List()
    for i in range(depth):
      self.mixs.append(Mix(in_features=in_features, rngs=rngs))

  def __call__(self, x):
    @nnx.remat
    def block(x, layer):
      return layer(x, 2.0)

    @nnx.remat
    def block_(x, layer):
      return layer(x)

    scaleds_iter = iter(self.scaleds)
    plains_iter = iter(self.plains)
    for i in range(self.depth):
      x = block(x, next(scaleds_iter))
      x = block_(x, next(plains_iter))
    b = 0.5

    @nnx.remat
    def run_mixs(x, layer, b_):
      return layer(x, b, b_)

    for i, mix in zip(range(self.depth), self.mixs):
      x = run_mixs(x, mix, i * 1.0)
    return x
