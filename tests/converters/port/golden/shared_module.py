"""One embedding shared by an encoder and a decoder (Flax's WMT
Transformer): `setup()` makes it under a condition of the configuration and
hands it to both as a field. The port hands the one NNX module to both;
`PATHS` maps Linen's `shared_embedding` where NNX keeps it, the first
attribute its traversal meets (`decoder/shared_embedding`)."""

import dataclasses
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int = 11
  emb_dim: int = 8
  share_embeddings: bool = False


class Encoder(nn.Module):
  config: Config
  shared_embedding: Any = None

  @nn.compact
  def __call__(self, tokens):
    if self.shared_embedding is None:
      embed = nn.Embed(self.config.vocab_size, self.config.emb_dim, name='embed')
    else:
      embed = self.shared_embedding
    return nn.Dense(self.config.emb_dim, name='out')(embed(tokens))


class Decoder(nn.Module):
  config: Config
  shared_embedding: Any = None

  @nn.compact
  def __call__(self, encoded, tokens):
    if self.shared_embedding is None:
      embed = nn.Embed(self.config.vocab_size, self.config.emb_dim, name='embed')
    else:
      embed = self.shared_embedding
    y = embed(tokens) + encoded.mean(axis=1, keepdims=True)
    return nn.Dense(self.config.vocab_size, name='logits')(y)


class Seq2Seq(nn.Module):
  config: Config

  def setup(self):
    config = self.config
    if config.share_embeddings:
      self.shared_embedding = nn.Embed(config.vocab_size, config.emb_dim)
    else:
      self.shared_embedding = None
    self.encoder = Encoder(config=config, shared_embedding=self.shared_embedding)
    self.decoder = Decoder(config=config, shared_embedding=self.shared_embedding)

  def __call__(self, inputs, targets):
    return self.decoder(self.encoder(inputs), targets)


def model() -> LinenModel:
  tokens = jnp.arange(12).reshape(2, 6) % 11
  return LinenModel(Seq2Seq(Config(share_embeddings=True)), tokens, tokens[:, :5])
