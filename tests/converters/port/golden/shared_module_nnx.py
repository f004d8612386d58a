"""NNX port of `tests.converters.port.golden.shared_module`, written by `linen-nnx
port tests.converters.port.golden.shared_module:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`shared_module_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
shared_module_nnx_paths:PATHS`). Proven equivalent when written: see
`test_shared_module_nnx_port.py`.
"""
from __future__ import annotations

from typing import Any

from flax import nnx

from tests.converters.port.golden.shared_module import Config


class Encoder(nnx.Module):

  def __init__(self, config: Config, shared_embedding: Any = None, *, rngs: nnx.Rngs):
    self.shared_embedding = shared_embedding
    if shared_embedding is None:
      self.embed = nnx.Embed(config.vocab_size, config.emb_dim, rngs=rngs)
    self.out = nnx.Linear(
        config.emb_dim if shared_embedding is None else shared_embedding.features,
        config.emb_dim,
        rngs=rngs,
    )

  def __call__(self, tokens):
    if self.shared_embedding is None:
      embed = self.embed
    else:
      embed = self.shared_embedding
    return self.out(embed(tokens))


class Decoder(nnx.Module):

  def __init__(self, config: Config, shared_embedding: Any = None, *, rngs: nnx.Rngs):
    self.shared_embedding = shared_embedding
    if shared_embedding is None:
      self.embed = nnx.Embed(config.vocab_size, config.emb_dim, rngs=rngs)
    self.logits = nnx.Linear(
        config.emb_dim if shared_embedding is None else shared_embedding.features,
        config.vocab_size,
        rngs=rngs,
    )

  def __call__(self, encoded, tokens):
    if self.shared_embedding is None:
      embed = self.embed
    else:
      embed = self.shared_embedding
    y = embed(tokens) + encoded.mean(axis=1, keepdims=True)
    return self.logits(y)


class Seq2Seq(nnx.Module):

  def __init__(self, config: Config, *, rngs: nnx.Rngs):
    self.config = config
    config = self.config
    if config.share_embeddings:
      self.shared_embedding = nnx.Embed(config.vocab_size, config.emb_dim, rngs=rngs)
    else:
      self.shared_embedding = nnx.data(None)
    self.encoder = Encoder(config=config, shared_embedding=self.shared_embedding, rngs=rngs)
    self.decoder = Decoder(config=config, shared_embedding=self.shared_embedding, rngs=rngs)

  def __call__(self, inputs, targets):
    return self.decoder(self.encoder(inputs), targets)
