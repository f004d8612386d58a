"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:loop_between_layers`.

Each class is the NNX counterpart of the Linen class of the same name;
`loop_between_layers_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
loop_between_layers_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class LoopBetweenLayers(nnx.Module):
  """A `Dense` before the loop's and two after: Linen numbers the loop's
  from 1 and the last two after it (`Dense_{i+1}`, `Dense_{n}`, `Dense_{n+1}`)."""

  def __init__(self, widths: tuple[int, ...] = (6, 6), *, in_features: int, rngs: nnx.Rngs):
    self.widths = widths
    self.dense_0 = nnx.Linear(in_features, 5, rngs=rngs)
    self.denses = nnx.List()
    in_size = 5
    for width in widths:
      self.denses.append(nnx.Linear(in_size, width, rngs=rngs))
      in_size = width
    self.dense_3 = nnx.Linear(in_size, 4, rngs=rngs)
    self.dense_4 = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, x):
    x = self.dense_0(x)
    for dense in self.denses:
      x = nnx.relu(dense(x))
    x = self.dense_3(x)
    return self.dense_4(x)
