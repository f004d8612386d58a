"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:stack`.

Each class is the NNX counterpart of the Linen class of the same name;
`stack_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths stack_nnx_paths:PATHS`).

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `train=False`, `model.train()` to train.
"""
from __future__ import annotations

import jax
from flax import nnx

from tests.converters.port.linen_models import StackConfig


class Stack(nnx.Module):
  """Dense layers in a loop, each taking the previous one's width."""

  def __init__(self, config: StackConfig, *, in_features: int, rngs: nnx.Rngs):
    self.denses = nnx.List()
    for width in config.widths:
      self.denses.append(nnx.Linear(in_features, width, rngs=rngs))
      in_features = width
    self.norm = nnx.LayerNorm(in_features, rngs=rngs)
    self.dropout = nnx.Dropout(config.rate, rngs=rngs)
    self.head = nnx.Linear(in_features, config.out, use_bias=False, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    for dense in self.denses:
      x = dense(x)  # the input size comes from the previous layer
      x = nnx.relu(x)
    x = self.norm(x)
    x = self.dropout(x)
    return self.head(x)
