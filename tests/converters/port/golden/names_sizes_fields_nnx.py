"""NNX port of `tests.converters.port.golden.names_sizes_fields`, written by
`linen-nnx port tests.converters.port.golden.names_sizes_fields:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`names_sizes_fields_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
names_sizes_fields_nnx_paths:PATHS`). Proven equivalent when written: see
`test_names_sizes_fields_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Stem(nnx.Module):

  def __init__(self, features: int = 8, scale: float = 2.0, *, in_features: int, rngs: nnx.Rngs):
    self.scale = scale
    self.conv = nnx.Conv(in_features, features, (3, 3), strides=(2, 2), padding='SAME', rngs=rngs)

  def __call__(self, x):
    x = self.conv(x)
    return nnx.relu(x) * self.scale


class Net(nnx.Module):

  def __init__(self, features: int = 8, hidden: int = 16, *, x_shape: tuple[int, ...], rngs: nnx.Rngs):
    self.stem = Stem(features, in_features=x_shape[-1], rngs=rngs)
    self.dense_0 = nnx.Linear(
        (x_shape[0] + 1) // 2 * ((x_shape[1] + 1) // 2) * features,
        hidden,
        rngs=rngs,
    )
    self.dense_1 = nnx.Linear(hidden, 2, rngs=rngs)

  def __call__(self, x):
    stem = self.stem
    x = stem(x)
    x = x.reshape((x.shape[0], -1))
    x = self.dense_0(x) * stem.scale
    return self.dense_1(nnx.relu(x))
