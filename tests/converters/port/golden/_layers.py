"""Linen layers of a module of their own, which `module_attribute` reads
through its module (`layers.Block`)."""

from flax import linen as nn


class Scale(nn.Module):
  """Doubles its input: no variables."""

  @nn.compact
  def __call__(self, x):
    return x * 2


class Block(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.width)(Scale()(x))
