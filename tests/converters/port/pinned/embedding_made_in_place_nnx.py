"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:embedding_made_in_place`.

Each class is the NNX counterpart of the Linen class of the same name;
`embedding_made_in_place_nnx_paths.PATHS`, written beside this file, maps the
Linen variables onto these modules (`linen-nnx convert --paths
embedding_made_in_place_nnx_paths:PATHS`).
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


class EmbeddingMadeInPlace(nnx.Module):
  """An embedding made in place as the argument of the module using it."""

  def __init__(self, vocab: int = 11, width: int = 4, *, rngs: nnx.Rngs):
    self.vocab = vocab
    self.width = width
    self.embed = nnx.Embed(vocab, width, rngs=rngs)
    self.embedding_user = EmbeddingUser(emb=self.embed, rngs=rngs)

  def __call__(self, tokens):
    return self.embedding_user(tokens)
