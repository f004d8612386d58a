"""NNX port of `tests.converters.port.golden.sequential_compact`, written by
`linen-nnx port tests.converters.port.golden.sequential_compact:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`sequential_compact_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
sequential_compact_nnx_paths:PATHS`). Proven equivalent when written: see
`test_sequential_compact_nnx_port.py`.

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `train=False`, `model.train()` to train.
"""
from __future__ import annotations

from flax import nnx


class Block(nnx.Module):

  def __init__(self, features: int, *, rngs: nnx.Rngs):
    self.dense = nnx.Linear(features, features, rngs=rngs)
    self.layer_norm = nnx.LayerNorm(features, rngs=rngs)

  def __call__(self, x):
    return x + self.dense(self.layer_norm(x))


class Tower(nnx.Module):

  def __init__(self, depth: int = 2, width: int = 8, rate: float = 0.1, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(in_features, width, rngs=rngs)
    self.sequentials = nnx.List()
    for _ in range(depth):
      self.sequentials.append(
          nnx.Sequential(Block(width, rngs=rngs), lambda y: nnx.gelu(y) * 2, nnx.Dropout(rate, rngs=rngs)),
      )
    self.head = nnx.Sequential(
        nnx.Linear(width, width * 2, rngs=rngs),
        nnx.relu,
        nnx.Linear(width * 2, 3, rngs=rngs),
    )

  def __call__(self, x):
    x = self.dense_0(x)
    for sequential in self.sequentials:
      x = sequential(x)
    head = self.head
    return head(x)
