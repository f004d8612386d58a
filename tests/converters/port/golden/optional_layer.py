"""A layer a field left None skips (a ViT's `pre_logits`): the head after it
takes that field's width where it is given, the width before it where not."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Classifier(nn.Module):
  hidden_size: int = 8
  representation_size: int | None = None
  num_classes: int = 3

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.hidden_size, name='embedding')(x)
    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, name='pre_logits')(x))
    return nn.Dense(self.num_classes, name='head')(x)


def model(hidden_size: int = 8) -> LinenModel:
  return LinenModel(Classifier(hidden_size), jnp.ones((2, 5)))
