"""NNX port of `tests.converters.port.golden.optional_layer`, written by
`linen-nnx port tests.converters.port.golden.optional_layer:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`optional_layer_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
optional_layer_nnx_paths:PATHS`). Proven equivalent when written: see
`test_optional_layer_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Classifier(nnx.Module):

  def __init__(self, hidden_size: int = 8, representation_size: int | None = None, num_classes: int = 3, *, in_features: int, rngs: nnx.Rngs):
    self.representation_size = representation_size
    self.embedding = nnx.Linear(in_features, hidden_size, rngs=rngs)
    if representation_size is not None:
      self.pre_logits = nnx.Linear(hidden_size, representation_size, rngs=rngs)
    self.head = nnx.Linear(
        representation_size if representation_size is not None else hidden_size,
        num_classes,
        rngs=rngs,
    )

  def __call__(self, x):
    x = self.embedding(x)
    if self.representation_size is not None:
      x = nnx.tanh(self.pre_logits(x))
    return self.head(x)
