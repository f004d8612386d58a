"""The decoder-only transformer LM ported to Flax NNX.

`nnx.Embed` and `embed.attend` (tied logits), `nnx.MultiHeadAttention`,
`nnx.LayerNorm`/`nnx.RMSNorm`, `nnx.Dropout` (on after `model.train()`, off
after `model.eval()`). Looped blocks live in an `nnx.List`; scanned blocks
(`config.scan_layers`) are created stacked with `nnx.split_rngs` + `nnx.vmap`
and run with `nnx.scan` over `nnx.remat`, both with
`transform_metadata={nnx.PARTITION_NAME: ...}` so that the layer axis is
inserted into every annotation.

`idiom` picks one of the three ways real ports annotate the parameters that
the Linen original annotates with logical names (see `IDIOMS`). `attention`
picks the attention: `'multi_head'`, `nnx.MultiHeadAttention` with Linen's
parameters (query, key, value kernels (E, H, D), out (H, D, E)); or
`'fused_qkv'`, `FusedAttention`, as many ports write it: one `nnx.Linear`
(E, 3 * E) whose output holds query, key and value side by side, and an out
`nnx.Linear` (E, E), the heads flattened. Creation
needs a mesh in context (`with jax.set_mesh(mesh):`) since eager sharding is
on by default. With `'context_rules'` it also needs the rules
(`with jax.set_mesh(mesh), nnx.logical_axis_rules(RULES):`; without them the
logical names are taken for mesh axes and creation fails), and so does
anything that resolves the names again (`nnx.get_partition_spec`).

Decoding: `model.init_cache(batch_size)` (under the same mesh) adds the
key/value caches and position indices (`nnx.Cache` Variables), then call
`model(tokens, decode=True)` with one token `(batch, 1)` at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from model_zoo.configs import RULES, TransformerConfig

#: How parameters are annotated: `'rules_metadata'`, logical names in
#: `out_sharding` and the rules as `sharding_rules` metadata; `'context_rules'`,
#: logical names only, the rules from `nnx.logical_axis_rules(RULES)` in
#: context; `'mesh_axes'`, the names already resolved to mesh axes, no rules.
IDIOMS = ('rules_metadata', 'context_rules', 'mesh_axes')
#: The attention a port uses: Linen's parameters, or fused and flattened kernels.
ATTENTIONS = ('multi_head', 'fused_qkv')

KERNEL_INIT = nnx.initializers.xavier_uniform()
EMBED_INIT = nnx.initializers.normal(stddev=1.0)
POSITION_INIT = nnx.initializers.normal(stddev=0.02)


# [side-by-side: rules-context]
def _resolve(names: tuple[str | None, ...]) -> tuple[str | None, ...]:
  """Logical names -> mesh axes under `RULES`, as Linen's resolver does it."""
  return tuple(nn.logical_to_mesh_axes(names, RULES))


def _logical(idiom: str, init, names):
  """`init` annotated with `names` in the style `idiom` names."""
  if idiom == 'rules_metadata':
    return nnx.with_partitioning(init, names, sharding_rules=RULES)
  if idiom == 'context_rules':
    return nnx.with_partitioning(init, names)
  return nnx.with_partitioning(init, _resolve(names))


def _layer_axis(idiom: str) -> str | None:
  """The name `nnx.vmap`/`nnx.scan` insert for the stacked layer axis."""
  return _resolve(('layers',))[0] if idiom == 'mesh_axes' else 'layers'
# [/side-by-side]


def _norm(config: TransformerConfig, rngs: nnx.Rngs) -> nnx.Module:
  if config.norm == 'rmsnorm':
    return nnx.RMSNorm(config.width, rngs=rngs)
  return nnx.LayerNorm(config.width, rngs=rngs)


# [side-by-side: decode-cache]
class PositionEmbedding(nnx.Module):
  """Adds learned position embeddings; in decode mode, of the position in `cache_index`."""

  def __init__(self, config: TransformerConfig, idiom: str, *, rngs: nnx.Rngs):
    init = _logical(idiom, POSITION_INIT, ('length', 'embed'))
    self.embedding = nnx.Param(init(rngs.params(), (config.max_len, config.width)))

  def init_cache(self) -> None:
    self.cache_index = nnx.Cache(jnp.array(0, jnp.uint32))

  def __call__(self, x: jax.Array, *, decode: bool = False) -> jax.Array:
    embedding = self.embedding[...]
    if decode:
      i = self.cache_index[...]
      self.cache_index[...] = i + x.shape[1]
      return x + jax.lax.dynamic_slice_in_dim(embedding, i, x.shape[1])[None]
    return x + embedding[None, : x.shape[1]]
# [/side-by-side]


class Mlp(nnx.Module):
  """Linear, GELU, linear, dropout."""

  def __init__(self, config: TransformerConfig, idiom: str, *, rngs: nnx.Rngs):
    zeros = nnx.initializers.zeros_init()
    self.up = nnx.Linear(
        config.width,
        config.mlp_dim,
        kernel_init=_logical(idiom, KERNEL_INIT, ('embed', 'mlp')),
        bias_init=_logical(idiom, zeros, ('mlp',)),
        rngs=rngs,
    )
    self.down = nnx.Linear(
        config.mlp_dim,
        config.width,
        kernel_init=_logical(idiom, KERNEL_INIT, ('mlp', 'embed')),
        bias_init=_logical(idiom, zeros, ('embed',)),
        rngs=rngs,
    )
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = self.up(x)
    x = nnx.gelu(x)
    x = self.down(x)
    return self.dropout(x)


class FusedAttention(nnx.Module):
  """Causal self-attention with one fused query/key/value projection.

  `qkv` maps (..., E) to (..., 3 * E): query, key and value in turn, each
  the heads side by side (H * D); `out` maps the flattened heads back to E.
  Decoding keeps `nnx.MultiHeadAttention`'s cache: `cached_key`,
  `cached_value` (batch, max_len, H, D) and `cache_index`.
  """

  def __init__(self, config: TransformerConfig, idiom: str, *, rngs: nnx.Rngs):
    self.num_heads, self.head_dim = config.num_heads, config.head_dim
    self.qkv = nnx.Linear(
        config.width, 3 * config.width, use_bias=False,
        kernel_init=_logical(idiom, KERNEL_INIT, ('embed', 'kv')), rngs=rngs,
    )
    self.out = nnx.Linear(
        config.width, config.width, use_bias=False,
        kernel_init=_logical(idiom, KERNEL_INIT, ('kv', 'embed')), rngs=rngs,
    )
    self.dropout_rate = config.attention_dropout_rate
    self.deterministic = False
    self.rngs = rngs.dropout.fork() if self.dropout_rate > 0 else None
    # Data, not static attributes: `init_cache` puts Cache Variables there.
    self.cached_key = self.cached_value = self.cache_index = nnx.data(None)

  def init_cache(self, input_shape: tuple[int, ...], dtype=jnp.float32) -> None:
    shape = (*input_shape[:-1], self.num_heads, self.head_dim)
    self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
    self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
    self.cache_index = nnx.Cache(jnp.array(0, dtype=jnp.int32))

  def __call__(self, x: jax.Array, *, mask: jax.Array | None, decode: bool = False) -> jax.Array:
    *batch, length, width = x.shape
    heads = lambda y: y.reshape(*batch, length, self.num_heads, self.head_dim)
    query, key, value = map(heads, jnp.split(self.qkv(x), 3, axis=-1))
    if decode:  # one position at a time, as nnx.MultiHeadAttention decodes
      index = self.cache_index[...]
      start = (0,) * len(batch) + (index, 0, 0)
      key = jax.lax.dynamic_update_slice(self.cached_key[...], key, start)
      value = jax.lax.dynamic_update_slice(self.cached_value[...], value, start)
      self.cached_key[...], self.cached_value[...] = key, value
      self.cache_index[...] += 1
      max_length = key.shape[-3]
      written = jnp.arange(max_length) <= index
      mask = nnx.combine_masks(mask, jnp.broadcast_to(written, (*batch, 1, 1, max_length)))
    deterministic = self.deterministic or self.dropout_rate == 0
    y = nnx.dot_product_attention(
        query, key, value, mask=mask, dropout_rate=self.dropout_rate,
        dropout_rng=None if deterministic else self.rngs(),
        broadcast_dropout=False, deterministic=deterministic,
    )
    return self.out(y.reshape(*batch, length, width))


class Block(nnx.Module):
  """Pre-norm causal self-attention and MLP, each with a residual connection."""

  def __init__(
      self, config: TransformerConfig, idiom: str, *, attention: str = 'multi_head', rngs: nnx.Rngs
  ):
    self.attention_norm = _norm(config, rngs)
    if attention == 'fused_qkv':
      self.attention = FusedAttention(config, idiom, rngs=rngs)
    else:
      self.attention = self._multi_head(config, idiom, rngs)
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
    self.mlp_norm = _norm(config, rngs)
    self.mlp = Mlp(config, idiom, rngs=rngs)

  @staticmethod
  def _multi_head(config: TransformerConfig, idiom: str, rngs: nnx.Rngs) -> nnx.MultiHeadAttention:
    return nnx.MultiHeadAttention(
        num_heads=config.num_heads,
        in_features=config.width,
        qkv_features=config.width,
        # One initializer for query, key, value (E, H, D) and out (H, D, E),
        # as in Linen.
        kernel_init=_logical(idiom, KERNEL_INIT, ('embed', 'kv')),
        use_bias=False,
        broadcast_dropout=False,
        dropout_rate=config.attention_dropout_rate,
        decode=False,
        rngs=rngs,
    )

  def __call__(self, x: jax.Array, mask: jax.Array | None, *, decode: bool = False):
    y = self.attention_norm(x)
    y = self.attention(y, mask=mask, decode=decode)
    y = self.dropout(y)
    x = x + y
    y = self.mlp_norm(x)
    y = self.mlp(y)
    return x + y


# [side-by-side: remat-scan]
class TransformerLM(nnx.Module):
  """`__call__(tokens)` maps int tokens `(batch, length)` to logits `(batch, length, vocab)`.

  With `decode=True`, `length` is 1 and `init_cache` must have run.
  """

  def __init__(
      self,
      config: TransformerConfig,
      *,
      idiom: str = 'rules_metadata',
      attention: str = 'multi_head',
      rngs: nnx.Rngs,
  ):
    if idiom not in IDIOMS:
      raise ValueError(f'idiom must be one of {IDIOMS}, got {idiom!r}')
    if attention not in ATTENTIONS:
      raise ValueError(f'attention must be one of {ATTENTIONS}, got {attention!r}')
    self.config = config
    self.idiom = idiom
    self.embed = nnx.Embed(
        config.vocab_size,
        config.width,
        embedding_init=_logical(idiom, EMBED_INIT, ('vocab', 'embed')),
        rngs=rngs,
    )
    self.pos_embed = PositionEmbedding(config, idiom, rngs=rngs)
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
    if config.scan_layers:

      @nnx.split_rngs(splits=config.num_layers)
      @nnx.vmap(
          in_axes=(0,),
          out_axes=0,
          transform_metadata={nnx.PARTITION_NAME: _layer_axis(idiom)},
      )
      def create_blocks(rngs: nnx.Rngs) -> Block:
        return Block(config, idiom, attention=attention, rngs=rngs)

      self.blocks = create_blocks(rngs)
    else:
      self.blocks = nnx.List([
          Block(config, idiom, attention=attention, rngs=rngs) for _ in range(config.num_layers)
      ])
    self.final_norm = _norm(config, rngs)

  def init_cache(self, batch_size: int, dtype=jnp.float32) -> None:
    """Adds empty key/value caches of `config.max_len` positions and zero position indices."""
    config = self.config
    shape = (batch_size, config.max_len, config.width)
    self.pos_embed.init_cache()
    if config.scan_layers:

      @nnx.vmap(
          in_axes=(0,),
          out_axes=0,
          axis_size=config.num_layers,
          transform_metadata={nnx.PARTITION_NAME: _layer_axis(self.idiom)},
      )
      def init_block_caches(blocks: Block) -> None:
        blocks.attention.init_cache(shape, dtype)

      init_block_caches(self.blocks)
    else:
      for block in self.blocks:
        block.attention.init_cache(shape, dtype)

  def __call__(self, tokens: jax.Array, *, decode: bool = False) -> jax.Array:
    config = self.config
    x = self.embed(tokens)
    x = self.pos_embed(x, decode=decode)
    x = self.dropout(x)
    # In decode mode the attention masks the cache positions not yet written.
    mask = None if decode else nnx.make_causal_mask(tokens)
    if config.scan_layers:

      @nnx.scan(
          in_axes=(nnx.Carry, 0),
          out_axes=nnx.Carry,
          transform_metadata={nnx.PARTITION_NAME: _layer_axis(self.idiom)},
      )
      @nnx.remat(prevent_cse=False)
      def forward(x: jax.Array, block: Block) -> jax.Array:
        return block(x, mask, decode=decode)

      x = forward(x, self.blocks)
    else:
      for block in self.blocks:
        x = block(x, mask, decode=decode)
    x = self.final_norm(x)
    return self.embed.attend(x)
# [/side-by-side]


# [side-by-side: rules-context]
def make_mesh(
    shape: tuple[int, int] = (2, 4), axis_type=jax.sharding.AxisType.Auto
) -> jax.sharding.Mesh:
  """A `('data', 'model')` mesh; NNX creates models on Auto or Explicit axes."""
  return jax.make_mesh(shape, ('data', 'model'), axis_types=(axis_type,) * 2)


def create_sharded(
    config: TransformerConfig, mesh: jax.sharding.Mesh, idiom: str, seed: int = 0
) -> TransformerLM:
  """A `TransformerLM` with every array created in its shards (eager sharding)."""
  # Only `'context_rules'` needs the rules in context; the context merges with
  # any `sharding_rules` metadata.
  with jax.set_mesh(mesh), nnx.logical_axis_rules(RULES if idiom == 'context_rules' else ()):
    return nnx.jit(lambda: TransformerLM(config, idiom=idiom, rngs=nnx.Rngs(seed)))()
# [/side-by-side]
