"""Initializers chosen by a field and spread into a layer (big_vision's
head: `kw = {'kernel_init': nn.initializers.zeros} if self.head_zeroinit
else {}`, then `nn.Dense(..., **kw)`): the choice is written into the NNX
layer's creation, its keys NNX's names, and the local leaves `__call__`."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Head(nn.Module):
  num_classes: int = 3
  head_zeroinit: bool = False
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    kw = {'kernel_init': nn.initializers.zeros} if self.head_zeroinit else {}
    x = nn.Dense(8, name='pre_logits', **({'use_bias': False} if not self.use_bias else {'use_bias': True}))(x)
    return nn.Dense(self.num_classes, name='head', **kw)(nn.tanh(x))


def model() -> LinenModel:
  return LinenModel(Head(), jnp.ones((2, 5)))
