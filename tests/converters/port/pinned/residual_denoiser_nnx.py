"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:residual_denoiser`.

Each class is the NNX counterpart of the Linen class of the same name;
`residual_denoiser_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
residual_denoiser_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class ResidualDenoiser(nnx.Module):
  """DnCNN's shape (scico): the output is `x - y`, y of `channels`
  features, which ties the input's channels to that field."""

  def __init__(self, channels: int = 1, features: int = 4, depth: int = 3, *, rngs: nnx.Rngs):
    self.conv_0 = nnx.Conv(channels, features, (3, 3), rngs=rngs)
    self.convs = nnx.List()
    in_size = features
    for _ in range(depth - 2):
      self.convs.append(nnx.Conv(in_size, features, (3, 3), rngs=rngs))
      in_size = features
    self.conv_2 = nnx.Conv(in_size, channels, (3, 3), rngs=rngs)

  def __call__(self, x):
    y = nnx.relu(self.conv_0(x))
    for conv in self.convs:
      y = nnx.relu(conv(y))
    return x - self.conv_2(y)
