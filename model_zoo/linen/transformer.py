"""A decoder-only transformer LM in Flax Linen, in the style of Flax's lm1b example.

Tied input/output embeddings (`nn.Embed` and `embed.attend`), learned position
embeddings, pre-norm blocks of causal `nn.MultiHeadDotProductAttention` and an
MLP, dropout. Kernels, MLP biases and embeddings carry logical axis names
(`nn.with_logical_partitioning`, no rules in the boxes); the rules come from
`with nn.logical_axis_rules(model_zoo.configs.RULES):` around `init` and
`apply`, as in Flax's lm1b and gemma examples. The norms' scales and biases
are left bare (replicated), as those examples leave them. `DenseGeneral` kernels, and so the attention's,
are rank 3 and carry the two names written for the flat kernel.

`config.scan_layers` stacks the blocks with `nn.scan(nn.remat(Block))`
(submodule `ScanCheckpointBlock_0`, params stacked on a leading `layers`
axis) instead of looping over `Block_0`, `Block_1`, ...

Decoding: `TransformerLM(config, decode=True)`, `init` on a `(batch, max_len)`
input creates the `cache` collection (key/value caches and position indices);
then `apply` one token `(batch, 1)` at a time with `mutable=['cache']`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from model_zoo.configs import RULES, TransformerConfig

KERNEL_INIT = nn.initializers.xavier_uniform()
EMBED_INIT = nn.initializers.normal(stddev=1.0)
POSITION_INIT = nn.initializers.normal(stddev=0.02)


# [side-by-side: rules-context]
def _logical(init, names):
  """`init` annotated with logical names; the rules come from the context at use."""
  return nn.with_logical_partitioning(init, names)
# [/side-by-side]


def _norm(config: TransformerConfig, name: str) -> nn.Module:
  if config.norm == 'rmsnorm':
    return nn.RMSNorm(name=name)
  return nn.LayerNorm(name=name)


# [side-by-side: decode-cache]
class PositionEmbedding(nn.Module):
  """Adds learned position embeddings; in decode mode, of the position in `cache`."""

  config: TransformerConfig
  decode: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    config = self.config
    embedding = self.param(
        'embedding', _logical(POSITION_INIT, ('length', 'embed')), (config.max_len, config.width)
    )
    if self.decode:
      # `init` creates the index; later calls read and advance it.
      is_initialized = self.has_variable('cache', 'cache_index')
      index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.uint32))
      if is_initialized:
        i = index.value
        index.value = i + x.shape[1]
        return x + jax.lax.dynamic_slice_in_dim(embedding, i, x.shape[1])[None]
    return x + embedding[None, : x.shape[1]]
# [/side-by-side]


class Mlp(nn.Module):
  """Dense, GELU, dense, dropout."""

  config: TransformerConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    config = self.config
    zeros = nn.initializers.zeros_init()
    x = nn.Dense(
        config.mlp_dim,
        kernel_init=_logical(KERNEL_INIT, ('embed', 'mlp')),
        bias_init=_logical(zeros, ('mlp',)),
    )(x)
    x = nn.gelu(x)
    x = nn.Dense(
        config.width,
        kernel_init=_logical(KERNEL_INIT, ('mlp', 'embed')),
        bias_init=_logical(zeros, ('embed',)),
    )(x)
    return nn.Dropout(config.dropout_rate, deterministic=self.deterministic)(x)


class Block(nn.Module):
  """Pre-norm causal self-attention and MLP, each with a residual connection.

  Returns `(x, None)` so that `nn.scan` can carry `x`.
  """

  config: TransformerConfig
  deterministic: bool = True
  decode: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None):
    config = self.config
    y = _norm(config, 'attention_norm')(x)
    y = nn.MultiHeadDotProductAttention(
        num_heads=config.num_heads,
        qkv_features=config.width,
        # One initializer for query, key, value (E, H, D) and out (H, D, E).
        kernel_init=_logical(KERNEL_INIT, ('embed', 'kv')),
        use_bias=False,
        broadcast_dropout=False,
        dropout_rate=config.attention_dropout_rate,
        deterministic=self.deterministic,
        decode=self.decode,
        name='attention',
    )(y, mask=mask)
    y = nn.Dropout(config.dropout_rate, deterministic=self.deterministic)(y)
    x = x + y
    y = _norm(config, 'mlp_norm')(x)
    y = Mlp(config, self.deterministic, name='mlp')(y)
    return x + y, None


# [side-by-side: remat-scan]
class TransformerLM(nn.Module):
  """`__call__(tokens, train)` maps int tokens `(batch, length)` to logits `(batch, length, vocab)`.

  With `decode=True`, `length` is 1 after the `init` that creates the cache.
  """

  config: TransformerConfig
  decode: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
    config = self.config
    deterministic = not train
    embed = nn.Embed(
        config.vocab_size,
        config.width,
        embedding_init=_logical(EMBED_INIT, ('vocab', 'embed')),
        name='embed',
    )
    x = embed(tokens)
    x = PositionEmbedding(config, self.decode, name='pos_embed')(x)
    x = nn.Dropout(config.dropout_rate, deterministic=deterministic)(x)
    # In decode mode the attention masks the cache positions not yet written.
    mask = None if self.decode else nn.make_causal_mask(tokens)
    if config.scan_layers:
      blocks = nn.scan(
          nn.remat(Block, prevent_cse=False),
          variable_axes={'params': 0, 'cache': 0},
          split_rngs={'params': True, 'dropout': True},
          in_axes=nn.broadcast,
          length=config.num_layers,
          metadata_params={nn.PARTITION_NAME: 'layers'},
      )
      x, _ = blocks(config, deterministic, self.decode)(x, mask)
    else:
      for _ in range(config.num_layers):
        x, _ = Block(config, deterministic, self.decode)(x, mask)
    x = _norm(config, 'final_norm')(x)
    return embed.attend(x)
# [/side-by-side]


# [side-by-side: rules-context]
def make_mesh(shape: tuple[int, int] = (2, 4)) -> jax.sharding.Mesh:
  """A `('data', 'model')` mesh with Auto axes, which Linen's constraints need."""
  return jax.make_mesh(shape, ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def create_sharded(
    model: TransformerLM, mesh: jax.sharding.Mesh, tokens: jax.Array, seed: int = 0
) -> dict:
  """`model.init` with every array created in its shards, the rules from the context."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    key = jax.random.key(seed)
    abstract = jax.eval_shape(model.init, key, tokens)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh)
    return jax.jit(model.init, out_shardings=shardings)(key, tokens)
# [/side-by-side]
