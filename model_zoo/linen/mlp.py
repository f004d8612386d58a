"""A small MLP classifier in Flax Linen, two ways a port in progress meets it.

`BridgedMLP` is half-ported: its hidden layer is already an NNX module, run
inside the Linen model by `nnx.bridge.ToLinen` (its parameters sit in the Linen
tree, `params/hidden/kernel`), so a codebase can move one module at a time
and keep `init` / `apply` until the last one moves. `SowingMLP` records its
hidden activations with `self.sow('intermediates', ...)`, which
`hidden_activations` collects by calling `apply` with
`mutable=['intermediates']` (without it, `sow` does nothing).
"""

from __future__ import annotations

import jax
from flax import linen as nn
from flax import nnx
from flax.nnx import bridge


# [side-by-side: bridge]
class BridgedMLP(nn.Module):
  """`__call__(x)` maps `(batch, in_features)` to logits; the hidden layer is NNX's."""

  in_features: int
  hidden: int
  num_classes: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    # NNX modules take their input sizes: ToLinen builds one from its arguments.
    x = bridge.ToLinen(nnx.Linear, args=(self.in_features, self.hidden), name='hidden')(x)
    x = nn.relu(x)
    return nn.Dense(self.num_classes, name='logits')(x)
# [/side-by-side]


# [side-by-side: sow]
class SowingMLP(nn.Module):
  """`__call__(x)` maps `(batch, features)` to logits, sowing the hidden activations."""

  hidden: int
  num_classes: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = nn.relu(nn.Dense(self.hidden, name='hidden')(x))
    self.sow('intermediates', 'features', x)
    return nn.Dense(self.num_classes, name='logits')(x)


def hidden_activations(model: SowingMLP, variables, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The logits and the hidden activations of one call."""
  logits, state = model.apply(variables, x, mutable=['intermediates'])
  (hidden,) = state['intermediates']['features']  # a tuple: one entry per `sow`
  return logits, hidden
# [/side-by-side]
