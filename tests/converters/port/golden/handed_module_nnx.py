"""NNX port of `tests.converters.port.golden.handed_module`, written by `linen-nnx
port tests.converters.port.golden.handed_module:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`handed_module_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
handed_module_nnx_paths:PATHS`). Proven equivalent when written: see
`test_handed_module_nnx_port.py`.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx


def posemb_sincos_1d(length, width, dtype=jnp.float32):
  position = jnp.arange(length)[:, None]
  omega = 1.0 / 10000 ** (jnp.arange(width // 2) / (width // 2))
  angles = position * omega[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=1)[None].astype(dtype)


def get_posemb(self, typ, length, width, name, dtype=jnp.float32):
  if typ == 'learn':
    return getattr(self, name)[...]
  elif typ == 'sincos':
    return posemb_sincos_1d(length, width, dtype=dtype)
  else:
    raise ValueError(f'unknown posemb {typ!r}')


def scaled(module, x):
  return x * module.scale[...]


class Embedder(nnx.Module):

  def __init__(self, width: int = 8, posemb: str = 'learn', *, x_shape: tuple[int, ...], x_dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):
    self.posemb = posemb
    self.dense = nnx.Linear(x_shape[-1], width, rngs=rngs)
    if posemb == 'learn':
      self.pos_embedding = nnx.Param(
          nnx.initializers.normal(stddev=1 / np.sqrt(width))(rngs.params(), (1, x_shape[0], width), x_dtype),
      )
    self.scale = nnx.Param(nnx.initializers.ones(rngs.params(), (width,)))

  def __call__(self, x):
    x = self.dense(x)
    _, l, c = x.shape
    x = x + get_posemb(self, self.posemb, l, c, 'pos_embedding', x.dtype)
    return scaled(self, x)
