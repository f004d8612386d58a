"""NNX port of `tests.converters.port.golden.layer_subclass`, written by
`linen-nnx port tests.converters.port.golden.layer_subclass:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`layer_subclass_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
layer_subclass_nnx_paths:PATHS`). Proven equivalent when written: see
`test_layer_subclass_nnx_port.py`.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from flax import nnx


def weight_standardize(w, axis, eps):
  """Subtracts mean and divides by standard deviation."""
  w = w - jnp.mean(w, axis=axis)
  return w / (jnp.std(w, axis=axis) + eps)


def _std_conv_param(name: str, param):
  """What Linen's StdConv.param did to each parameter the layer read."""
  if name == 'kernel':
    param = weight_standardize(param, axis=[0, 1, 2], eps=1e-5)
  return param


def _std_conv_promote_dtype(arrays, dtype=None):
  """nnx.Conv's promotion of `(inputs, kernel, bias)`, each parameter first as
  Linen's StdConv.param had it."""
  inputs, kernel, bias = arrays
  kernel = _std_conv_param('kernel', kernel)
  bias = None if bias is None else _std_conv_param('bias', bias)
  return nnx.nn.dtypes.promote_dtype((inputs, kernel, bias), dtype=dtype)


class StdConv(nnx.Conv):
  """Convolution with weight standardization.

  Linen's `param` changed each parameter as the layer read it; nnx.Conv
  hands its parameters to `promote_dtype` before it uses them, which
  changes them the same way (_std_conv_promote_dtype).
  """

  def __init__(self, *args, mask=None, **kwargs):
    if mask is not None:
      raise NotImplementedError('StdConv changes the kernel after nnx.Conv masks it, where Linen changed it before: port the mask by hand')
    super().__init__(*args, promote_dtype=_std_conv_promote_dtype, **kwargs)


class Unit(nnx.Module):

  def __init__(self, features: int, strides: Sequence[int] = (1, 1), *, in_features: int, rngs: nnx.Rngs):
    self.conv_proj = StdConv(in_features, features * 2, (1, 1), strides, use_bias=False, rngs=rngs)
    self.conv1 = StdConv(in_features, features, (3, 3), strides, rngs=rngs)
    self.conv2 = StdConv(features, features * 2, (1, 1), rngs=rngs)

  def __call__(self, x):
    residual = self.conv_proj(x)
    y = self.conv1(x)
    y = self.conv2(nnx.relu(y))
    return nnx.relu(residual + y)


class Stage(nnx.Module):

  def __init__(self, block_size: int, features: int, first_stride: Sequence[int], *, in_features: int, rngs: nnx.Rngs):
    self.unit1 = Unit(features, strides=first_stride, in_features=in_features, rngs=rngs)
    self.units = nnx.List()
    for i in range(1, block_size):
      self.units.append(Unit(features, in_features=features * 2, rngs=rngs))

  def __call__(self, x):
    x = self.unit1(x)
    for unit in self.units:
      x = unit(x)
    return x
