"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:noisy_embedder`.

Each class is the NNX counterpart of the Linen class of the same name;
`noisy_embedder_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
noisy_embedder_nnx_paths:PATHS`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class WordDropout(nnx.Module):
  """Flax's sst2 word dropout: in training, each token replaced by `unk`
  with probability `rate`, drawn from the `dropout` stream by the module."""

  def __init__(self, rate: float, unk: int, *, rngs: nnx.Rngs):
    self.rate = rate
    self.unk = unk
    self.rngs = rngs

  def __call__(self, ids, deterministic: bool = True):
    if deterministic or self.rate == 0.0:
      return ids
    mask = jax.random.bernoulli(self.rngs.dropout(), p=self.rate, shape=ids.shape)
    return jnp.where(mask, jnp.array([self.unk]), ids)


class NoisyEmbedder(nnx.Module):
  """Word dropout in training, embeddings, noise of its own in every mode."""

  def __init__(self, vocab: int = 10, *, rngs: nnx.Rngs):
    self.vocab = vocab
    self.rngs = rngs
    self.word_dropout = WordDropout(0.3, 0, rngs=rngs)
    self.embed = nnx.Embed(vocab, 4, rngs=rngs)
    self.dense = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, ids, train: bool = False):
    ids = self.word_dropout(ids, deterministic=not train)
    x = self.embed(ids)
    x = x + jax.random.normal(self.rngs.noise(), x.shape)
    return self.dense(x)
