"""NNX port of `tests.converters.port.golden.diffusion_idioms`, written by
`linen-nnx port tests.converters.port.golden.diffusion_idioms:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`diffusion_idioms_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
diffusion_idioms_nnx_paths:PATHS`). Proven equivalent when written: see
`test_diffusion_idioms_nnx_port.py`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def sincos_table(key, width, count):
  """A fixed table (`key` unused, as a parameter's initializer takes it)."""
  del key
  positions = jnp.arange(count, dtype=jnp.float32)[:, None]
  scales = jnp.exp(-jnp.arange(0, width, 2, dtype=jnp.float32) / width)[None]
  return jnp.concatenate([jnp.sin(positions * scales), jnp.cos(positions * scales)], axis=-1)[None]


class LabelEmbedder(nnx.Module):

  def __init__(self, classes: int, width: int, drop: float | None = None, *, rngs: nnx.Rngs):
    self.classes = classes
    self.drop = drop
    self.rngs = rngs
    self.embed = nnx.Embed(classes + 1, width, rngs=rngs)

  def token_drop(self, labels):
    keep = jax.random.bernoulli(self.rngs.label_dropout(), 1 - self.drop, labels.shape)
    return jnp.where(keep, labels, self.classes)

  def __call__(self, labels, train):
    if train and self.drop:
      labels = self.token_drop(labels)
    return self.embed(labels)


class Head(nnx.Module):

  def __init__(self, out_channels: int, hidden: int = 16, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(hidden, out_channels, rngs=rngs)
    self.dense_1 = nnx.Linear(in_features, hidden, rngs=rngs)

  def __call__(self, x):
    return self.dense_0(nnx.gelu(self.dense_1(x)))


class Denoiser(nnx.Module):

  def __init__(self, width: int = 8, classes: int = 4, learn_sigma: bool = False, head: Any = None, *, x_shape: tuple[int, ...], rngs: nnx.Rngs):
    self.table = nnx.Param(sincos_table(rngs.params(), width, x_shape[0]))
    self.dense = nnx.Linear(x_shape[-1], width, rngs=rngs)
    self.label_embedder = LabelEmbedder(classes, width, 0.25, rngs=rngs)
    self.head_0 = Head(
        x_shape[-1] * 2 if learn_sigma else x_shape[-1],
        **(head or {}),
        in_features=width,
        rngs=rngs,
    )

  def __call__(self, x, labels, train=False):
    table = self.table[...]
    x = self.dense(x) + jax.lax.stop_gradient(table)
    x = x + self.label_embedder(labels, train)[:, None]
    return self.head_0(x)
