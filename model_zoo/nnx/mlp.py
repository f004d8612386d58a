"""The small MLP classifier in Flax NNX, two ways a port in progress meets it.

`BridgedMLP` is the other half of a migration: an NNX model whose hidden
layer is still the Linen module, run inside it by `nnx.bridge.ToNNX`. Linen
infers the layer's input size from its first input, so the model is created
and then initialised once on an example input (`nnx.bridge.lazy_init`, which
`create_bridged` calls); its parameters are `nnx.Param`s like the rest.
`SowingMLP` records its hidden activations with
`self.sow(nnx.Intermediate, ...)`; `hidden_activations` collects them with
`nnx.capture`, which returns them beside the output without storing them in
the model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx
from flax.nnx import bridge


# [side-by-side: bridge]
class BridgedMLP(nnx.Module):
  """`__call__(x)` maps `(batch, in_features)` to logits; the hidden layer is Linen's."""

  def __init__(self, hidden: int, num_classes: int, *, rngs: nnx.Rngs):
    # Linen's shape inference stays: the Linen module creates its parameters
    # on its first input (`bridge.lazy_init`), so no input size here.
    self.hidden = bridge.ToNNX(nn.Dense(hidden), rngs=rngs)
    self.logits = nnx.Linear(hidden, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = self.hidden(x)
    x = nnx.relu(x)
    return self.logits(x)


def create_bridged(
    in_features: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs
) -> BridgedMLP:
  """A `BridgedMLP` with every parameter created."""
  model = BridgedMLP(hidden, num_classes, rngs=rngs)
  return bridge.lazy_init(model, jnp.zeros((1, in_features)))
# [/side-by-side]


# [side-by-side: sow]
class SowingMLP(nnx.Module):
  """`__call__(x)` maps `(batch, features)` to logits, sowing the hidden activations."""

  def __init__(self, features: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(features, hidden, rngs=rngs)
    self.logits = nnx.Linear(hidden, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = nnx.relu(self.hidden(x))
    self.sow(nnx.Intermediate, 'features', x)
    return self.logits(x)


def hidden_activations(model: SowingMLP, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The logits and the hidden activations of one call."""
  logits, intermediates = nnx.capture(model, nnx.Intermediate)(x)
  (hidden,) = intermediates['features'].get_value()  # a tuple: one entry per `sow`
  return logits, hidden
# [/side-by-side]
