"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:shared_embedding`.

Each class is the NNX counterpart of the Linen class of the same name;
`shared_embedding_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
shared_embedding_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class SharedEmbedding(nnx.Module):
  """A shared layer whose variable Linen makes in its `setup()` (nn.Embed)."""

  def __init__(self, vocab: int = 10, *, rngs: nnx.Rngs):
    self.vocab = vocab
    self.emb = nnx.Embed(vocab, 4, rngs=rngs)

  def __call__(self, tokens):
    emb = self.emb
    return emb(tokens)


class HoldsASharedEmbedding(nnx.Module):

  def __init__(self, vocab: int = 10, *, rngs: nnx.Rngs):
    self.vocab = vocab
    self.dense = nnx.Linear(4, 3, rngs=rngs)
    self.p = SharedEmbedding(vocab, rngs=rngs)

  def __call__(self, tokens):
    return self.dense(self.p(tokens))
