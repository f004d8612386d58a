"""NNX port of `tests.converters.port.golden.keyword_inputs`, written by
`linen-nnx port tests.converters.port.golden.keyword_inputs:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`keyword_inputs_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
keyword_inputs_nnx_paths:PATHS`). Proven equivalent when written: see
`test_keyword_inputs_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Block(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.layer_norm = nnx.LayerNorm(in_features, rngs=rngs)
    self.dense = nnx.Linear(in_features, in_features, rngs=rngs)

  def __call__(self, x):
    return self.layer_norm(self.dense(inputs=x))


class Net(nnx.Module):

  def __init__(self, features: int = 6, *, in_features: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(in_features, features, rngs=rngs)
    self.block = Block(in_features=features, rngs=rngs)
    self.checkpoint_dense = nnx.Linear(features, 2, rngs=rngs)

  def __call__(self, x):
    h = self.dense(inputs=x)
    h = self.block(x=h)

    @nnx.remat
    def run_checkpoint_dense(layer):
      return layer(inputs=h)

    return run_checkpoint_dense(self.checkpoint_dense)
