"""A Gemma-style decoder in Linen (as google-deepmind/gemma writes it: `q_einsum`
`(N, D, H)`, a `kv_einsum` `(2, K, D, H)` for key and value, a `gating_einsum`
`(2, F, D)` for gate and up, a norm by hand) and its port as Hugging Face's
Gemma reads (`q_proj`/`k_proj`/`v_proj`/`o_proj` `Linear`s of heads merged,
`gate_proj`/`up_proj`/`down_proj`): the key and value split, the gate and up
split, the heads merged, with no rule given. At the default sizes N == K and
D == N * H, so four `(D, D)` projections share the size of a `kv` part."""
import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx


class Einsum(nn.Module):
  shape: tuple

  @nn.compact
  def __call__(self, eqn, x):
    w = self.param('w', nn.initializers.normal(0.3), self.shape)
    return jnp.einsum(eqn, x, w)


class RMSNorm(nn.Module):
  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.zeros_init(), (x.shape[-1],))
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(var + 1e-6) * (1 + scale)


class Attention(nn.Module):
  num_heads: int
  num_kv_heads: int
  features: int
  head_dim: int

  def setup(self):
    self.q_einsum = Einsum((self.num_heads, self.features, self.head_dim))
    self.kv_einsum = Einsum((2, self.num_kv_heads, self.features, self.head_dim))
    self.attn_vec_einsum = Einsum((self.num_heads, self.head_dim, self.features))

  def __call__(self, x):
    q = self.q_einsum('BTD,NDH->BTNH', x)
    k, v = self.kv_einsum('BSD,CKDH->CBSKH', x)
    k, v = (jnp.repeat(a, self.num_heads // self.num_kv_heads, axis=2) for a in (k, v))  # grouped queries
    q = q * self.head_dim ** -0.5
    logits = jnp.einsum('BTNH,BSNH->BTNS', q, k)
    t = x.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))[None, :, None, :]
    probs = jax.nn.softmax(jnp.where(mask, logits, -2.3819763e38), axis=-1)
    encoded = jnp.einsum('BTNS,BSNH->BTNH', probs, v)
    return self.attn_vec_einsum('BTNH,NHD->BTD', encoded)


class FeedForward(nn.Module):
  features: int
  hidden_dim: int

  @nn.compact
  def __call__(self, x):
    w_gating = self.param('gating_einsum', nn.initializers.normal(0.3), (2, self.hidden_dim, self.features))
    ff_gate = jnp.dot(x, w_gating[0].T)
    ff1 = jnp.dot(x, w_gating[1].T)
    w_linear = self.param('linear', nn.initializers.normal(0.3), (self.hidden_dim, self.features))
    return jnp.dot(nn.gelu(ff_gate) * ff1, w_linear)


class Block(nn.Module):
  num_heads: int
  num_kv_heads: int
  features: int
  head_dim: int
  hidden_dim: int

  def setup(self):
    self.pre_attention_norm = RMSNorm()
    self.attn = Attention(self.num_heads, self.num_kv_heads, self.features, self.head_dim)
    self.pre_ffw_norm = RMSNorm()
    self.mlp = FeedForward(self.features, self.hidden_dim)

  def __call__(self, x):
    x = x + self.attn(self.pre_attention_norm(x))
    return x + self.mlp(self.pre_ffw_norm(x))


class Decoder(nn.Module):
  num_layers: int = 2
  num_heads: int = 2
  num_kv_heads: int = 2
  features: int = 8
  head_dim: int = 4
  hidden_dim: int = 12

  def setup(self):
    self.layers = [Block(self.num_heads, self.num_kv_heads, self.features, self.head_dim, self.hidden_dim,
                         name=f'layer_{i}') for i in range(self.num_layers)]
    self.final_norm = RMSNorm()

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return self.final_norm(x)


# -- the port, written as a Hugging Face Gemma reads --------------------------

class PortRMSNorm(nnx.Module):
  def __init__(self, dim):
    self.weight = nnx.Param(jnp.zeros(dim))

  def __call__(self, x):
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(var + 1e-6) * (1 + self.weight[...])


class PortAttention(nnx.Module):
  def __init__(self, num_heads, num_kv_heads, features, head_dim, rngs):
    self.n, self.kv, self.h = num_heads, num_kv_heads, head_dim
    self.q_proj = nnx.Linear(features, num_heads * head_dim, use_bias=False, rngs=rngs)
    self.k_proj = nnx.Linear(features, num_kv_heads * head_dim, use_bias=False, rngs=rngs)
    self.v_proj = nnx.Linear(features, num_kv_heads * head_dim, use_bias=False, rngs=rngs)
    self.o_proj = nnx.Linear(num_heads * head_dim, features, use_bias=False, rngs=rngs)

  def __call__(self, x):
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, self.n, self.h) * self.h ** -0.5
    k = self.k_proj(x).reshape(b, t, self.kv, self.h)
    v = self.v_proj(x).reshape(b, t, self.kv, self.h)
    k, v = (jnp.repeat(a, self.n // self.kv, axis=2) for a in (k, v))
    logits = jnp.einsum('btnh,bsnh->btns', q, k)
    mask = jnp.tril(jnp.ones((t, t), bool))[None, :, None, :]
    probs = jax.nn.softmax(jnp.where(mask, logits, -2.3819763e38), axis=-1)
    encoded = jnp.einsum('btns,bsnh->btnh', probs, v)
    return self.o_proj(encoded.reshape(b, t, self.n * self.h))


class PortMLP(nnx.Module):
  def __init__(self, features, hidden_dim, rngs):
    self.gate_proj = nnx.Linear(features, hidden_dim, use_bias=False, rngs=rngs)
    self.up_proj = nnx.Linear(features, hidden_dim, use_bias=False, rngs=rngs)
    self.down_proj = nnx.Linear(hidden_dim, features, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return self.down_proj(nnx.gelu(self.gate_proj(x)) * self.up_proj(x))


class PortLayer(nnx.Module):
  def __init__(self, num_heads, num_kv_heads, features, head_dim, hidden_dim, rngs):
    self.input_layernorm = PortRMSNorm(features)
    self.self_attn = PortAttention(num_heads, num_kv_heads, features, head_dim, rngs)
    self.post_attention_layernorm = PortRMSNorm(features)
    self.mlp = PortMLP(features, hidden_dim, rngs)

  def __call__(self, x):
    x = x + self.self_attn(self.input_layernorm(x))
    return x + self.mlp(self.post_attention_layernorm(x))


class PortDecoder(nnx.Module):
  def __init__(self, num_layers=2, num_heads=2, num_kv_heads=2, features=8, head_dim=4, hidden_dim=12, *, rngs):
    self.layers = nnx.List([PortLayer(num_heads, num_kv_heads, features, head_dim, hidden_dim, rngs)
                            for _ in range(num_layers)])
    self.norm = PortRMSNorm(features)

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return self.norm(x)
