"""NNX port of `tests.converters.port.golden.named_by_fields`, written by
`linen-nnx port tests.converters.port.golden.named_by_fields:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`named_by_fields_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
named_by_fields_nnx_paths:PATHS`). Proven equivalent when written: see
`test_named_by_fields_nnx_port.py`.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class Embedder(nnx.Module):

  def __init__(self, vocab_size: int, embed_dim: int, *, rngs: nnx.Rngs):
    self.embed_dim = embed_dim
    self.input_embedding_table = nnx.Param(
        nnx.initializers.normal()(rngs.params(), (vocab_size, embed_dim)),
    )

  def encode(self, tokens):
    return self.input_embedding_table[...][(tokens,)] * jnp.sqrt(self.embed_dim)

  def decode(self, x):
    return jnp.dot(x, self.input_embedding_table[...].T)


class Einsum(nnx.Module):
  """A parameterized tensor product."""

  def __init__(self, shape: tuple[int, ...], weight_name: str = 'w', *, rngs: nnx.Rngs):
    self.shape = shape
    self.weight_name = weight_name
    setattr(self, weight_name, nnx.Param(nnx.initializers.normal()(rngs.params(), shape)))

  def __call__(self, eqn: str, x):
    w = getattr(self, self.weight_name)[...]
    return jnp.einsum(eqn, x, w)


class Block(nnx.Module):

  def __init__(self, features: int, hidden: int, *, rngs: nnx.Rngs):
    self.einsum_0 = Einsum((features, hidden), weight_name='gating', rngs=rngs)
    self.einsum_1 = Einsum((hidden, features), rngs=rngs)

  def __call__(self, x):
    h = self.einsum_0('...F,FH->...H', x)
    return x + self.einsum_1('...H,HF->...F', nnx.gelu(h))


class Stack(nnx.Module):

  def __init__(self, num_layers: int = 2, features: int = 4, hidden: int = 8, vocab_size: int = 11, *, rngs: nnx.Rngs):
    self.embedder = Embedder(vocab_size, features, rngs=rngs)
    self.blocks = nnx.List([Block(features, hidden, rngs=rngs) for i in range(num_layers)])

  def __call__(self, tokens):
    x = self.embedder.encode(tokens)
    for block in self.blocks:
      x = block(x)
    return self.embedder.decode(x)
