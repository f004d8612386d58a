"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:positions_of_the_inputs_dtype`.

Each class is the NNX counterpart of the Linen class of the same name;
`positions_of_the_inputs_dtype_nnx_paths.PATHS`, written beside this file, maps
the Linen variables onto these modules (`linen-nnx convert --paths
positions_of_the_inputs_dtype_nnx_paths:PATHS`).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class PositionsOfTheInputsDtype(nnx.Module):
  """Position embeddings made in the dtype of the inputs (scenic's
  `AddPositionEmbs`), and a probe in that of a value of the call."""

  def __init__(self, *, inputs_shape: tuple[int, ...], inputs_dtype: jnp.dtype = jnp.float32, x_dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):
    self.pos_embedding = nnx.Param(
        nnx.initializers.normal(0.02)(rngs.params(), (1, inputs_shape[0], inputs_shape[-1]), inputs_dtype),
    )
    self.dense = nnx.Linear(inputs_shape[-1], 4, rngs=rngs)
    self.probe = nnx.Param(nnx.initializers.xavier_uniform()(rngs.params(), (1, 1, 4), x_dtype))

  def __call__(self, inputs):
    pe = self.pos_embedding[...]
    x = self.dense(inputs + pe)
    probe = self.probe[...]
    return x * probe
