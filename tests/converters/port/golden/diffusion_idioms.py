"""Idioms of a public JAX DiT: a parameter made by an initializer taking
sizes of the input (`get_2d_sincos_pos_embed(key, width, num_patches)`), a
block given a size computed from the input (`out_channels`), a key drawn in
a helper method (`token_drop`), a field whose default is None though its
annotation says `float`, and a block's fields handed on as a dict
(`Head(**self.head)`)."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


def sincos_table(key, width, count):
  """A fixed table (`key` unused, as a parameter's initializer takes it)."""
  del key
  positions = jnp.arange(count, dtype=jnp.float32)[:, None]
  scales = jnp.exp(-jnp.arange(0, width, 2, dtype=jnp.float32) / width)[None]
  return jnp.concatenate([jnp.sin(positions * scales), jnp.cos(positions * scales)], axis=-1)[None]


class LabelEmbedder(nn.Module):
  classes: int
  width: int
  drop: float = None

  def token_drop(self, labels):
    keep = jax.random.bernoulli(self.make_rng('label_dropout'), 1 - self.drop, labels.shape)
    return jnp.where(keep, labels, self.classes)

  @nn.compact
  def __call__(self, labels, train):
    if train and self.drop:
      labels = self.token_drop(labels)
    return nn.Embed(self.classes + 1, self.width)(labels)


class Head(nn.Module):
  out_channels: int
  hidden: int = 16

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.out_channels)(nn.gelu(nn.Dense(self.hidden)(x)))


class Denoiser(nn.Module):
  width: int = 8
  classes: int = 4
  learn_sigma: bool = False
  head: Any = None

  @nn.compact
  def __call__(self, x, labels, train=False):
    channels = x.shape[-1]
    out_channels = channels * 2 if self.learn_sigma else channels
    count = x.shape[1]
    table = self.param('table', sincos_table, self.width, count)
    x = nn.Dense(self.width)(x) + jax.lax.stop_gradient(table)
    x = x + LabelEmbedder(self.classes, self.width, 0.25)(labels, train)[:, None]
    return Head(out_channels, **(self.head or {}))(x)


def model(width: int = 8) -> LinenModel:
  return LinenModel(Denoiser(width, head={'hidden': 12}), jnp.ones((2, 6, 3)), jnp.array([1, 3]), train=False)
