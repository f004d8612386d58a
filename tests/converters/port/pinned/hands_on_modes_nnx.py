"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:hands_on_modes`.

Each class is the NNX counterpart of the Linen class of the same name;
`hands_on_modes_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
hands_on_modes_nnx_paths:PATHS`).

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `deterministic=True`, `model.train()` to train.
"""
from __future__ import annotations

from flax import nnx


class Inner(nnx.Module):
  """A dense layer and a dropout, whose mode a field sets."""

  def __init__(self, features: int, *, in_features: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(in_features, features, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    x = self.dense(x)
    return self.dropout(x)


class HandsOnModes(nnx.Module):
  """`train` handed down as fields: `deterministic=not train` to a block,
  which hands its own `deterministic` to its dropout and to `Inner`."""

  def __init__(self, features: int, *, in_features: int, rngs: nnx.Rngs):
    self.inner = Inner(features, in_features=in_features, rngs=rngs)
    self.dropout = nnx.Dropout(0.25, rngs=rngs)
    self.out = nnx.Linear(features, features, rngs=rngs)

  def __call__(self, x):
    x = self.inner(x)
    x = self.dropout(x)
    return self.out(x)
