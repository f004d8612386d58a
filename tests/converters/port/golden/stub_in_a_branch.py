"""One class the port cannot write (a head using `nn.vmap`): that class
alone is a stub; the classes around it are written, build it through the
interface the stub states, and `PATHS` maps every variable outside it."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel

#: The classes written as stubs.
STUBS = ('PoolingHead',)


class Encoder(nn.Module):
  depth: int = 2
  width: int = 8
  rate: float = 0.1

  @nn.compact
  def __call__(self, x, train: bool = False):
    for _ in range(self.depth):
      x = x + nn.Dense(self.width)(nn.LayerNorm()(x))
      x = nn.Dropout(self.rate, deterministic=not train)(x)
    return x


class PoolingHead(nn.Module):
  """Pools the tokens with a learned probe."""

  width: int

  @nn.compact
  def __call__(self, x):
    probe = self.param('probe', nn.initializers.normal(), (1, 1, self.width))
    weigh = nn.vmap(lambda module, y: y, variable_axes={}, split_rngs={'params': False})
    return nn.Dense(self.width)((x * probe).mean(axis=1))


class Classifier(nn.Module):
  width: int = 8
  classes: int = 3

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(self.width)(x)
    x = Encoder(2, self.width)(x, train)
    return nn.Dense(self.classes)(PoolingHead(self.width)(x))


def model(width: int = 8) -> LinenModel:
  return LinenModel(Classifier(width), jnp.ones((2, 4, 5)))
