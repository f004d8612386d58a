"""Gemma's naming: a parameter named by a field (`self.param(self.weight_name,
...)` in its `Einsum`), the blocks of a `setup()` list named by a
comprehension (`name=f'layer_{i}'`), and an embedder called only through
its methods (`encode`, `decode`) whose attribute is not its variable's name
(`self.input_embedding_table = self.param('input_embedding', ...)`): the
parameter is the NNX attribute the field names (`setattr(self, weight_name,
...)`), the blocks an `nnx.List` whose entries `PATHS` maps from
`layer_{i}`, and the table the attribute the methods read, which `PATHS`
maps from `input_embedding`."""

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Einsum(nn.Module):
  """A parameterized tensor product."""

  shape: tuple[int, ...]
  weight_name: str = 'w'

  @nn.compact
  def __call__(self, eqn: str, x):
    w = self.param(self.weight_name, nn.initializers.normal(), self.shape)
    return jnp.einsum(eqn, x, w)


class Embedder(nn.Module):
  vocab_size: int
  embed_dim: int

  def setup(self):
    self.input_embedding_table = self.param(
        'input_embedding', nn.initializers.normal(), (self.vocab_size, self.embed_dim))

  def encode(self, tokens):
    return self.input_embedding_table[(tokens,)] * jnp.sqrt(self.embed_dim)

  def decode(self, x):
    return jnp.dot(x, self.input_embedding_table.T)


class Block(nn.Module):
  features: int
  hidden: int

  @nn.compact
  def __call__(self, x):
    h = Einsum((self.features, self.hidden), weight_name='gating')('...F,FH->...H', x)
    return x + Einsum((self.hidden, self.features))('...H,HF->...F', nn.gelu(h))


class Stack(nn.Module):
  num_layers: int = 2
  features: int = 4
  hidden: int = 8

  vocab_size: int = 11

  def setup(self):
    self.embedder = Embedder(self.vocab_size, self.features)
    self.blocks = [Block(self.features, self.hidden, name=f'layer_{i}') for i in range(self.num_layers)]

  def __call__(self, tokens):
    x = self.embedder.encode(tokens)
    for block in self.blocks:
      x = block(x)
    return self.embedder.decode(x)


def model() -> LinenModel:
  return LinenModel(Stack(), jnp.arange(6).reshape(2, 3) % 11)
