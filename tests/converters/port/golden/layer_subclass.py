"""A user's subclass of a Flax layer overriding `param` (vision_transformer's
weight-standardised `StdConv`), used by a bottleneck unit, in a stage whose
later units a loop names (`name=f'unit{i + 1}'`) and which the traced
configuration runs no times (`block_size=1`): the subclass is written as a
subclass of `nnx.Conv`, and the loop from the configurations the proof
tries, which run it. (A projection an input width switches, as the unit of
vision_transformer has, is the slow part of a trace: its proofs run the
public model.)"""

from collections.abc import Callable, Sequence
from typing import TypeVar

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel

T = TypeVar('T')


def weight_standardize(w, axis, eps):
  """Subtracts mean and divides by standard deviation."""
  w = w - jnp.mean(w, axis=axis)
  return w / (jnp.std(w, axis=axis) + eps)


class StdConv(nn.Conv):
  """Convolution with weight standardization."""

  def param(self, name: str, init_fn: Callable[..., T], *init_args) -> T:
    param = super().param(name, init_fn, *init_args)
    if name == 'kernel':
      param = weight_standardize(param, axis=[0, 1, 2], eps=1e-5)
    return param


class Unit(nn.Module):
  features: int
  strides: Sequence[int] = (1, 1)

  @nn.compact
  def __call__(self, x):
    residual = StdConv(self.features * 2, (1, 1), self.strides, use_bias=False, name='conv_proj')(x)
    y = StdConv(self.features, (3, 3), self.strides, name='conv1')(x)
    y = StdConv(self.features * 2, (1, 1), name='conv2')(nn.relu(y))
    return nn.relu(residual + y)


class Stage(nn.Module):
  block_size: int
  features: int
  first_stride: Sequence[int]

  @nn.compact
  def __call__(self, x):
    x = Unit(self.features, strides=self.first_stride, name='unit1')(x)
    for i in range(1, self.block_size):
      x = Unit(self.features, name=f'unit{i + 1}')(x)
    return x


def model() -> LinenModel:
  return LinenModel(Stage(block_size=1, features=4, first_stride=(2, 2)), jnp.ones((2, 8, 8, 3)))
