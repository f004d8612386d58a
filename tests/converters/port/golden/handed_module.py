"""Functions of the file handed the module, making parameters through it
(big_vision's `get_posemb(self, typ, seqshape, width, name, dtype)`): each
`self.param` is made in `__init__` under the function's tests, read with the
call's arguments (`if posemb == 'learn':`), and the function, written for
NNX, reads the attribute it made."""

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from converters import LinenModel


def posemb_sincos_1d(length, width, dtype=jnp.float32):
  position = jnp.arange(length)[:, None]
  omega = 1.0 / 10000 ** (jnp.arange(width // 2) / (width // 2))
  angles = position * omega[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=1)[None].astype(dtype)


def get_posemb(self, typ, length, width, name, dtype=jnp.float32):
  if typ == 'learn':
    return self.param(name, nn.initializers.normal(stddev=1 / np.sqrt(width)), (1, length, width), dtype)
  elif typ == 'sincos':
    return posemb_sincos_1d(length, width, dtype=dtype)
  else:
    raise ValueError(f'unknown posemb {typ!r}')


def scaled(module, x):
  return x * module.param('scale', nn.initializers.ones, (x.shape[-1],))


class Embedder(nn.Module):
  width: int = 8
  posemb: str = 'learn'

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.width)(x)
    n, l, c = x.shape
    x = x + get_posemb(self, self.posemb, l, c, 'pos_embedding', x.dtype)
    return scaled(self, x)


def model(width: int = 8) -> LinenModel:
  return LinenModel(Embedder(width), jnp.ones((2, 5, 3)))
