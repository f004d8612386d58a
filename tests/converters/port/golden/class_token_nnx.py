"""NNX port of `tests.converters.port.golden.class_token`, written by `linen-nnx
port tests.converters.port.golden.class_token:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`class_token_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
class_token_nnx_paths:PATHS`). Proven equivalent when written: see
`test_class_token_nnx_port.py`.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class Encoder(nnx.Module):
  def __init__(self, *, x_shape: tuple[int, ...], rngs: nnx.Rngs):
    self.pos_embedding = nnx.Param(
        nnx.initializers.normal(stddev=0.02)(rngs.params(), (1, x_shape[0], x_shape[-1])),
    )
    self.dense = nnx.Linear(x_shape[-1], x_shape[-1], rngs=rngs)

  def __call__(self, x):
    pos = self.pos_embedding[...]
    return self.dense(x + pos)


class Classifier(nnx.Module):

  def __init__(self, width: int = 8, classifier: str = 'token', *, x_shape: tuple[int, ...], rngs: nnx.Rngs):
    self.classifier = classifier
    self.dense = nnx.Linear(x_shape[-1], width, rngs=rngs)
    if classifier == 'token':
      self.cls = nnx.Param(nnx.initializers.zeros(rngs.params(), (1, 1, width)))
    self.encoder = Encoder(
        x_shape=(x_shape[0] + 1, width) if classifier == 'token' else (x_shape[0], width),
        rngs=rngs,
    )

  def __call__(self, x):
    x = self.dense(x)
    if self.classifier == 'token':
      cls = self.cls[...]
      x = jnp.concatenate([jnp.tile(cls, [x.shape[0], 1, 1]), x], axis=1)
    x = self.encoder(x)
    if self.classifier == 'token':
      return x[:, 0]
    if self.classifier == 'gap':
      return x.mean(axis=1)
    raise ValueError(f'unknown classifier {self.classifier!r}')
