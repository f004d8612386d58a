"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:one_list_two_layers`.

Each class is the NNX counterpart of the Linen class of the same name;
`one_list_two_layers_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
one_list_two_layers_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class OneListTwoLayers(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.layers = nnx.List([nnx.Linear(in_features, 4, rngs=rngs), nnx.Linear(4, 4, rngs=rngs)])

  def __call__(self, x):
    for layer in self.layers:
      x = nnx.relu(layer(x))
    return x
