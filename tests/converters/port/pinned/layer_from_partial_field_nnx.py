"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:layer_from_partial_field`.

Each class is the NNX counterpart of the Linen class of the same name;
`layer_from_partial_field_nnx_paths.PATHS`, written beside this file, maps the
Linen variables onto these modules (`linen-nnx convert --paths
layer_from_partial_field_nnx_paths:PATHS`).
"""
from __future__ import annotations

from typing import Any

from flax import nnx


class LayerFromField(nnx.Module):
  """A layer made by a field holding a module class (Flax's imagenet's
  `conv`, `block_cls`): the port makes it through the field, which holds
  NNX's class (`nnx.Linear` by default)."""

  def __init__(self, layer: Any = nnx.Linear, *, in_features: int, rngs: nnx.Rngs):
    self.dense = layer(in_features, 4, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)
