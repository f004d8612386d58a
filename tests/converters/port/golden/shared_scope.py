"""Gemma's block: a feed-forward whose two `Einsum`s keep their parameters in
its own scope (`nn.share_scope(self, gating)`, the gating one made in either
branch of an `if`, both traced), norms a `setup()` sets to `None` unless configured, an
attention kind compared with an enum of the file, and a branch of `setup()`
no configuration takes (`if self.fused:`): the shared modules are the
attributes their locals name, which `PATHS` maps from the block's own
scope (`mlp/gating_einsum` -> `mlp/gating/gating_einsum`); the norms
`nnx.data(None)` first (a static attribute would refuse the module); the
enum imported from the user's module, not copied (a copy's members are not
the user's); the untaken branch raises in `__init__` too."""

import enum

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class AttentionType(enum.Enum):
  GLOBAL = 1
  LOCAL = 2


class Einsum(nn.Module):
  shape: tuple[int, ...]
  weight_name: str = 'w'

  @nn.compact
  def __call__(self, eqn: str, x):
    w = self.param(self.weight_name, nn.initializers.normal(), self.shape)
    return jnp.einsum(eqn, x, w)


class FeedForward(nn.Module):
  features: int
  hidden_dim: int
  transpose_gating: bool = False

  @nn.compact
  def __call__(self, x):
    if self.transpose_gating:
      eq = '...F,NHF->...NH'
      gating = Einsum((2, self.hidden_dim, self.features), weight_name='gating_einsum')
    else:
      eq = '...F,NFH->...NH'
      gating = Einsum((2, self.features, self.hidden_dim), weight_name='gating_einsum')
    nn.share_scope(self, gating)
    gate = gating(eq, x)
    linear = Einsum((self.hidden_dim, self.features), weight_name='linear')
    nn.share_scope(self, linear)
    return linear('...H,HF->...F', nn.gelu(gate[..., 0, :]) * gate[..., 1, :])


class Mixer(nn.Module):
  features: int
  attn_type: AttentionType
  fused: bool = False

  def setup(self):
    if self.fused:
      self.qk = Einsum((2, self.features, self.features))
    else:
      self.q = Einsum((self.features, self.features))

  def __call__(self, x):
    y = self.q('...F,FG->...G', x)
    if self.attn_type == AttentionType.LOCAL:
      y = jnp.cumsum(y, axis=-2)
    return y


class Block(nn.Module):
  features: int = 4
  hidden_dim: int = 8
  attn_type: AttentionType = AttentionType.LOCAL
  use_post_norm: bool = True
  transpose_gating: bool = False

  def setup(self):
    self.mixer = Mixer(self.features, self.attn_type)
    self.post_norm = None
    if self.use_post_norm:
      self.post_norm = nn.LayerNorm()
    self.mlp = FeedForward(self.features, self.hidden_dim, self.transpose_gating)

  def __call__(self, x):
    y = self.mixer(x)
    if self.post_norm is not None:
      y = self.post_norm(y)
    return x + self.mlp(y)


def model() -> LinenModel:
  return LinenModel(Block(), jnp.linspace(-1.0, 1.0, 24).reshape(2, 3, 4))
