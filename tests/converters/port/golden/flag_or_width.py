"""A flag that takes a width as well (big_vision's `rep_size: Union[int,
bool] = False`): the proof tries a width (`rep_size=12`) beside the flip, and
the head after the optional `pre_logits` reads its input size off it where
it is made (`self.pre_logits.out_features if rep_size else width`)."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Head(nn.Module):
  width: int = 8
  rep_size: int | bool = False
  num_classes: int = 3

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.width)(x)
    if self.rep_size:
      rep_size = self.width if self.rep_size is True else self.rep_size
      x = nn.tanh(nn.Dense(rep_size, name='pre_logits')(x))
    if self.num_classes:
      x = nn.Dense(self.num_classes, name='head')(x)
    return x


def model() -> LinenModel:
  return LinenModel(Head(), jnp.ones((2, 5)))
