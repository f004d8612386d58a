"""A size an `if` on the configuration switches (vit_jax's ViT): a class
token makes the encoder's sequence one longer where `classifier` is
'token', so the encoder's input shape is written with that `if`."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Encoder(nn.Module):
  @nn.compact
  def __call__(self, x):
    pos = self.param('pos_embedding', nn.initializers.normal(stddev=0.02), (1, x.shape[1], x.shape[2]))
    return nn.Dense(x.shape[-1])(x + pos)


class Classifier(nn.Module):
  width: int = 8
  classifier: str = 'token'

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.width)(x)
    if self.classifier == 'token':
      cls = self.param('cls', nn.initializers.zeros, (1, 1, self.width))
      x = jnp.concatenate([jnp.tile(cls, [x.shape[0], 1, 1]), x], axis=1)
    x = Encoder()(x)
    if self.classifier == 'token':
      return x[:, 0]
    if self.classifier == 'gap':
      return x.mean(axis=1)
    raise ValueError(f'unknown classifier {self.classifier!r}')


def model(width: int = 8) -> LinenModel:
  return LinenModel(Classifier(width), jnp.ones((2, 5, 3)))
