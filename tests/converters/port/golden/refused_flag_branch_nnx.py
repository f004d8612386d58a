"""NNX port of `tests.converters.port.golden.refused_flag_branch`, written by
`linen-nnx port tests.converters.port.golden.refused_flag_branch:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`refused_flag_branch_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
refused_flag_branch_nnx_paths:PATHS`). Proven equivalent when written: see
`test_refused_flag_branch_nnx_port.py`.

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `deterministic=True`, `model.train()` to train.
"""
from __future__ import annotations

from flax import nnx


class Block(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    self.dense = nnx.Linear(in_features, in_features, rngs=rngs)

  def __call__(self, x):
    return self.dropout(nnx.relu(self.dense(x)))


class Encoder(nnx.Module):

  def __init__(self, depth: int = 2, per_example: bool = False, *, in_features: int, rngs: nnx.Rngs):
    self.per_example = per_example
    if per_example:
      raise NotImplementedError('Encoder: the if branch of `if self.per_example` is not written: nn.vmap of a module: not written yet; in NNX, call the module inside a function decorated @nnx.vmap, its state mapped by nnx.StateAxes (nnx.Param: None where variable_axes broadcast the parameters; 0 where they stack them, the stack made under @nnx.split_rngs and @nnx.vmap)')
    else:
      self.blocks = nnx.List()
      for i in range(depth):
        self.blocks.append(Block(in_features=in_features, rngs=rngs))
    self.norm = nnx.LayerNorm(in_features, rngs=rngs)

  def __call__(self, x):
    if self.per_example:
      raise NotImplementedError('Encoder: the if branch of `if self.per_example` is not written: nn.vmap of a module: not written yet; in NNX, call the module inside a function decorated @nnx.vmap, its state mapped by nnx.StateAxes (nnx.Param: None where variable_axes broadcast the parameters; 0 where they stack them, the stack made under @nnx.split_rngs and @nnx.vmap)')
    else:
      for layer in self.blocks:
        block_cur = layer
        x = block_cur(x)
    return self.norm(x)
