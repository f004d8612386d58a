"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:scanned_or_looped`.

Each class is the NNX counterpart of the Linen class of the same name;
`scanned_or_looped_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
scanned_or_looped_nnx_paths:PATHS`).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from tests.converters.port.linen_models import ScanConfig


class ResidualLayer(nnx.Module):
  """Returns `(x, None)`, as `nn.scan` wants: the carry and nothing stacked."""

  def __init__(self, config: ScanConfig, *, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(
        config.width,
        config.hidden,
        kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, 'model')),
        rngs=rngs,
    )
    self.layer_norm = nnx.LayerNorm(config.width, rngs=rngs)
    self.dense_1 = nnx.Linear(config.hidden, config.width, rngs=rngs)

  def __call__(self, x, scale):
    y = self.dense_0(self.layer_norm(x))
    return x + scale * self.dense_1(nnx.relu(y)), None


class ScannedOrLooped(nnx.Module):
  """Its layers in a Python loop, or scanned under remat (`config.scan`)."""

  def __init__(self, config: ScanConfig, *, in_features: int, rngs: nnx.Rngs):
    self.config = config
    self.dense = nnx.Linear(in_features, config.width, rngs=rngs)
    if config.scan:
      @nnx.split_rngs(splits=config.layers)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: 'layers'})
      def create_layers(rngs: nnx.Rngs):
        return ResidualLayer(config, rngs=rngs)
      self.layers = create_layers(rngs)
    else:
      self.layers = nnx.List()
      for _ in range(config.layers):
        self.layers.append(ResidualLayer(config, rngs=rngs))

  def __call__(self, x):
    x = self.dense(x)
    scale = jnp.float32(0.5)
    if self.config.scan:

      @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0), transform_metadata={nnx.PARTITION_NAME: 'layers'})
      @nnx.remat(prevent_cse=False)
      def layers(x, layer):
        return layer(x, scale)

      x, _ = layers(x, self.layers)
    else:
      for layer in self.layers:
        x, _ = layer(x, scale)
    return x
