"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:batch_normed`.

Each class is the NNX counterpart of the Linen class of the same name;
`batch_normed_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
batch_normed_nnx_paths:PATHS`).

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `train=False`, `model.train()` to train.
"""
from __future__ import annotations

from flax import nnx


class BatchNormed(nnx.Module):
  """A layer normalised by batch statistics (a collection a `TrainState`
  carries) with dropout after it, trained with `train=True`."""

  def __init__(self, features: int = 6, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(in_features, features, rngs=rngs)
    self.batch_norm = nnx.BatchNorm(features, momentum=0.9, rngs=rngs)
    self.dropout = nnx.Dropout(0.3, rngs=rngs)
    self.dense_1 = nnx.Linear(features, 3, rngs=rngs)

  def __call__(self, x):
    x = self.dense_0(x)
    x = self.batch_norm(x)
    x = self.dropout(nnx.relu(x))
    return self.dense_1(x)
