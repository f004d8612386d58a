"""Locals of a method, and a comprehension's variable, named as the file's
functions are: the port copies only the functions its classes read, not
those a local shadows (nor what they import, the kit among them)."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


def gate(x):
  """Read by `Net`: copied beside it."""
  return x * nn.sigmoid(x)


def hidden(features: int = 8) -> LinenModel:
  """Not read: each `hidden` in `Net` is its own local."""
  return LinenModel(Net(features), jnp.ones((2, 4)))


class Net(nn.Module):
  features: int = 8

  @nn.compact
  def __call__(self, x):
    hidden = gate(nn.Dense(self.features)(x))
    hidden = sum(hidden * model for model in (1.0, 2.0))
    return nn.Dense(2)(hidden)


def model(features: int = 8) -> LinenModel:
  return hidden(features)
