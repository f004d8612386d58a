"""A layer an `if` expression on the configuration makes in a loop: made
in `__init__` under its test, and read in `__call__` by an iterator, which
the `if` expression advances only where it takes that side (none are made
where `out_dim` is None)."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Repeated(nn.Module):
  out_dim: int | None = 5
  n: int = 2

  @nn.compact
  def __call__(self, x):
    for _ in range(self.n):
      x = nn.Dense(self.out_dim)(x) if self.out_dim is not None else x * 2
    return x


def model() -> LinenModel:
  return LinenModel(Repeated(), jnp.ones((2, 5)))
