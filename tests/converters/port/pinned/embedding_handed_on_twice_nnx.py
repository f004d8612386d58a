"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:embedding_handed_on_twice`.

Each class is the NNX counterpart of the Linen class of the same name;
`embedding_handed_on_twice_nnx_paths.PATHS`, written beside this file, maps the
Linen variables onto these modules (`linen-nnx convert --paths
embedding_handed_on_twice_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import linen as nn
from flax import nnx


class EmbeddingUser(nnx.Module):

  def __init__(self, emb: nn.Module, *, rngs: nnx.Rngs):
    self.emb = emb
    self.out = nnx.Linear(emb.features, 3, rngs=rngs)

  def __call__(self, tokens):
    return self.out(self.emb(tokens))


class HandsOnItsEmbedding(nnx.Module):
  """A module it was handed, handed on to the module that uses it."""

  def __init__(self, emb: nn.Module, *, rngs: nnx.Rngs):
    self.user = EmbeddingUser(emb=emb, rngs=rngs)

  def __call__(self, tokens):
    return self.user(tokens)


class EmbeddingHandedOnTwice(nnx.Module):
  """An embedding handed through a module that only hands it on."""

  def __init__(self, vocab: int = 11, width: int = 4, *, rngs: nnx.Rngs):
    self.vocab = vocab
    self.width = width
    self.table = nnx.Embed(vocab, width, rngs=rngs)
    self.outer = HandsOnItsEmbedding(emb=self.table, rngs=rngs)

  def __call__(self, tokens):
    return self.outer(tokens)
