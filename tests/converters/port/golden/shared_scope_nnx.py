"""NNX port of `tests.converters.port.golden.shared_scope`, written by `linen-nnx
port tests.converters.port.golden.shared_scope:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`shared_scope_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
shared_scope_nnx_paths:PATHS`). Proven equivalent when written: see
`test_shared_scope_nnx_port.py`.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from tests.converters.port.golden.shared_scope import AttentionType


class Einsum(nnx.Module):

  def __init__(self, shape: tuple[int, ...], weight_name: str = 'w', *, rngs: nnx.Rngs):
    self.shape = shape
    self.weight_name = weight_name
    setattr(self, weight_name, nnx.Param(nnx.initializers.normal()(rngs.params(), shape)))

  def __call__(self, eqn: str, x):
    w = getattr(self, self.weight_name)[...]
    return jnp.einsum(eqn, x, w)


class Mixer(nnx.Module):

  def __init__(self, features: int, attn_type: AttentionType, fused: bool = False, *, rngs: nnx.Rngs):
    self.attn_type = attn_type
    if fused:
      raise NotImplementedError('Mixer: the if branch of `if self.fused` was not traced, so the port does not write it: trace a configuration that takes it, or port it by hand')
    else:
      self.q = Einsum((features, features), rngs=rngs)

  def __call__(self, x):
    y = self.q('...F,FG->...G', x)
    if self.attn_type == AttentionType.LOCAL:
      y = jnp.cumsum(y, axis=-2)
    return y


class FeedForward(nnx.Module):

  def __init__(self, features: int, hidden_dim: int, transpose_gating: bool = False, *, rngs: nnx.Rngs):
    self.transpose_gating = transpose_gating
    if transpose_gating:
      self.gating = Einsum((2, hidden_dim, features), weight_name='gating_einsum', rngs=rngs)
    else:
      self.gating = Einsum((2, features, hidden_dim), weight_name='gating_einsum', rngs=rngs)
    self.linear = Einsum((hidden_dim, features), weight_name='linear', rngs=rngs)

  def __call__(self, x):
    if self.transpose_gating:
      eq = '...F,NHF->...NH'
      gating = self.gating
    else:
      eq = '...F,NFH->...NH'
      gating = self.gating
    gate = gating(eq, x)
    linear = self.linear
    return linear('...H,HF->...F', nnx.gelu(gate[..., 0, :]) * gate[..., 1, :])


class Block(nnx.Module):

  def __init__(self, features: int = 4, hidden_dim: int = 8, attn_type: AttentionType = AttentionType.LOCAL, use_post_norm: bool = True, transpose_gating: bool = False, *, rngs: nnx.Rngs):
    self.mixer = Mixer(features, attn_type, rngs=rngs)
    self.post_norm = nnx.data(None)
    if use_post_norm:
      self.post_norm = nnx.LayerNorm(features, rngs=rngs)
    self.mlp = FeedForward(features, hidden_dim, transpose_gating, rngs=rngs)

  def __call__(self, x):
    y = self.mixer(x)
    if self.post_norm is not None:
      y = self.post_norm(y)
    return x + self.mlp(y)
