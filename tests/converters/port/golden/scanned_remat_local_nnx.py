"""NNX port of `tests.converters.port.golden.scanned_remat_local`, written by
`linen-nnx port tests.converters.port.golden.scanned_remat_local:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`scanned_remat_local_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
scanned_remat_local_nnx_paths:PATHS`). Proven equivalent when written: see
`test_scanned_remat_local_nnx_port.py`.

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `deterministic=True`, `model.train()` to train.
"""
from __future__ import annotations

import jax
from flax import nnx


class Block(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    self.dense = nnx.Linear(in_features, in_features, rngs=rngs)
    self.layer_norm = nnx.LayerNorm(in_features, rngs=rngs)

  def __call__(self, x):
    y = self.dropout(nnx.gelu(self.dense(self.layer_norm(x))))
    return x + y, None


class Encoder(nnx.Module):

  def __init__(self, depth: int = 2, remat_policy: str = 'nothing_saveable', *, in_features: int, rngs: nnx.Rngs):
    self.remat_policy = remat_policy
    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create_encoderblock(rngs: nnx.Rngs):
      return Block(in_features=in_features, rngs=rngs)
    self.encoderblock = create_encoderblock(rngs)
    self.encoder_norm = nnx.LayerNorm(in_features, rngs=rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    @nnx.remat(prevent_cse=False, policy=getattr(jax.checkpoint_policies, self.remat_policy, None))
    def run_encoderblock(x, layer):
      return layer(x)

    x, _ = run_encoderblock(x, self.encoderblock)
    return self.encoder_norm(x)
