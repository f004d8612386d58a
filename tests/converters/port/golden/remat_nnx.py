"""NNX port of `tests.converters.port.golden.remat`, written by `linen-nnx port
tests.converters.port.golden.remat:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`remat_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths remat_nnx_paths:PATHS`). Proven
equivalent when written: see `test_remat_nnx_port.py`.

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


class Odd(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    self.dense = nnx.Linear(in_features, in_features, rngs=rngs)

  def __call__(self, x, double=False):
    return self.dropout(self.dense(x)) * (2.0 if double else 1.0)


class Scaled(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    self.dense = nnx.Linear(in_features, in_features, rngs=rngs)

  @nnx.remat(prevent_cse=False, static_argnums=(2,))
  def __call__(self, x, double=False):
    y = self.dropout(self.dense(x))
    return 2 * y if double else y


class Encoder(nnx.Module):

  def __init__(self, depth: int = 2, *, in_features: int, rngs: nnx.Rngs):
    self.blocks = nnx.List()
    for i in range(depth):
      self.blocks.append(Block(in_features=in_features, rngs=rngs))
    self.odds = nnx.List()
    for i in range(2):  # a static argument read off the loop: passed, static, not closed over
      self.odds.append(Odd(in_features=in_features, rngs=rngs))
    self.last = Block(in_features=in_features, rngs=rngs)
    self.scaled = Scaled(in_features=in_features, rngs=rngs)
    self.shared = Block(in_features=in_features, rngs=rngs)
    self.dense = nnx.Linear(in_features, 3, rngs=rngs)
    self.norm = nnx.LayerNorm(in_features, rngs=rngs)

  def __call__(self, x):
    @nnx.remat
    def block(x, layer):
      return layer(x)

    for layer in self.blocks:
      x = block(x, layer)

    @nnx.remat(static_argnums=(2,))
    def run_odds(x, layer, double):
      return layer(x, double)

    for i, odd in zip(range(2), self.odds):  # a static argument read off the loop: passed, static, not closed over
      x = run_odds(x, odd, i % 2 == 1)

    @nnx.remat(prevent_cse=False)
    def run_last(x, layer):
      return layer(x)

    x = run_last(x, self.last)
    x = self.scaled(x, True)
    shared = self.shared  # one module, called twice

    @nnx.remat
    def run_shared(x, layer):
      return layer(x)

    x = run_shared(run_shared(x, shared) + 1.0, shared)

    @nnx.remat
    def run_dense(inputs, layer):
      return layer(inputs)

    return run_dense(self.norm(x), self.dense)
