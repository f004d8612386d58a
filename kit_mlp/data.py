"""Synthetic regression batches, identical for both implementations.

Inputs are Gaussian and the target is a fixed smooth function of them, so the
MSE loss of a freshly initialised MLP goes down when it trains. Batches are made
on device, sharded like the models' activations (`('data', None)` in the guides), one batch or a
stack of `num_steps` batches for the several-steps-in-one-call train loops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kit_mlp.description import ModelDescription


def batch_sharding(
    desc: ModelDescription, mesh: Mesh, stacked: bool = False
) -> NamedSharding:
  """Inputs and targets sharded as the model's output activations are.

  `('data', None)` with device axes and with the guide's rules; with logical
  names, as Linen resolves `('batch', 'embed')` with the rules. A stack of
  batches gets a leading unsharded axis.
  """
  spec = desc.resolve(desc.axes.output)
  return NamedSharding(mesh, P(None, *spec) if stacked else P(*spec))


def make_batches(
    desc: ModelDescription, mesh: Mesh, num_steps: int | None = None, seed: int = 0
) -> tuple[jax.Array, jax.Array]:
  """`(x, y)` of shape `(batch, depth)`, or `(num_steps, batch, depth)`."""
  lead = () if num_steps is None else (num_steps,)
  shape = lead + (desc.batch, desc.depth)
  sharding = batch_sharding(desc, mesh, stacked=num_steps is not None)

  @jax.jit(out_shardings=(sharding, sharding))
  def make(key):
    x = jax.random.normal(key, shape, jnp.float32)
    y = jnp.sin(2.0 * x) * 0.5
    return x.astype(desc.jnp_dtype), y.astype(desc.jnp_dtype)

  return make(jax.random.key(seed))
