"""What the port names and keeps: a class's one `Dense` is `self.dense`, two
are `dense_0` and `dense_1`; a field only `__init__` reads is not kept, one
the methods or another class read is; a strided convolution's output size
reads `(h + 1) // 2`, from one example's shape (`x_shape`, no batch)."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Stem(nn.Module):
  features: int = 8
  scale: float = 2.0

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(self.features, (3, 3), strides=(2, 2), padding='SAME')(x)
    return nn.relu(x) * self.scale


class Net(nn.Module):
  features: int = 8
  hidden: int = 16

  @nn.compact
  def __call__(self, x):
    stem = Stem(self.features)
    x = stem(x)
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(self.hidden)(x) * stem.scale
    return nn.Dense(2)(nn.relu(x))


def model(features: int = 8) -> LinenModel:
  return LinenModel(Net(features), jnp.ones((2, 7, 9, 3)))
