"""Linen models written for the port's tests, as users write them: what the
port writes (compact layers, loops, names, modes) and what it must refuse
(a Linen API it does not write, a layer it does not know, a creation under
a condition on the inputs)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from converters import LinenModel


@dataclasses.dataclass(frozen=True)
class StackConfig:
  """A stack of dense layers (`widths`), a norm and the output."""

  widths: tuple[int, ...] = (8, 12)
  out: int = 3
  rate: float = 0.25


class Stack(nn.Module):
  """Dense layers in a loop, each taking the previous one's width."""

  config: StackConfig

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    config = self.config
    for width in config.widths:
      x = nn.Dense(width)(x)  # the input size comes from the previous layer
      x = nn.relu(x)
    x = nn.LayerNorm(name='norm')(x)
    x = nn.Dropout(config.rate, deterministic=not train)(x)
    return nn.Dense(config.out, use_bias=False, name='head')(x)


class Residual(nn.Module):
  """A user module used twice by its parent, and a scalar field."""

  features: int

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(self.features)(x)
    return x + nn.Dense(x.shape[-1])(nn.gelu(y))


class Tower(nn.Module):
  """An embedding, then residual blocks in a loop over a count."""

  vocab: int
  width: int
  hidden: int
  depth: int = 2

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab, self.width)(tokens)
    for _ in range(self.depth):
      x = Residual(self.hidden)(x)
    return nn.Dense(self.vocab)(x)


class Scaled(nn.Module):
  """`self.param` with a shape read from the input."""

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],))
    return nn.Dense(2)(x * scale)


class Counts(nn.Module):
  """A variable of `batch_stats` the call updates, and a sown value."""

  features: int = 2

  @nn.compact
  def __call__(self, x):
    total = self.variable('batch_stats', 'total', jnp.zeros, (x.shape[-1],))
    total.value = total.value + x.sum(0)
    self.sow('intermediates', 'seen', total.value)
    return nn.Dense(self.features)(x) + total.value.sum()


class UsesMakeRng(nn.Module):
  """`self.make_rng`: a draw from the port's `self.rngs.noise()`."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x + jax.random.normal(self.make_rng('noise'), x.shape))


class NoisyStep(nn.Module):
  """Draws in each step of a scan (its keys split per step)."""

  @nn.compact
  def __call__(self, x, _):
    return x + jax.random.normal(self.make_rng('noise'), x.shape), None


class ScannedNoise(nn.Module):
  """`self.make_rng` under `nn.scan`: not written yet."""

  @nn.compact
  def __call__(self, x):
    steps = nn.scan(NoisyStep, variable_axes={'params': 0}, split_rngs={'params': True, 'noise': True},
                    length=3)
    x, _ = steps()(x, None)
    return nn.Dense(2)(x)


class WordDropout(nn.Module):
  """Flax's sst2 word dropout: in training, each token replaced by `unk`
  with probability `rate`, drawn from the `dropout` stream by the module."""

  rate: float
  unk: int

  @nn.compact
  def __call__(self, ids, deterministic: bool = True):
    if deterministic or self.rate == 0.0:
      return ids
    mask = jax.random.bernoulli(self.make_rng('dropout'), p=self.rate, shape=ids.shape)
    return jnp.where(mask, jnp.array([self.unk]), ids)


class NoisyEmbedder(nn.Module):
  """Word dropout in training, embeddings, noise of its own in every mode."""

  vocab: int = 10

  @nn.compact
  def __call__(self, ids, train: bool = False):
    ids = WordDropout(0.3, 0)(ids, deterministic=not train)
    x = nn.Embed(self.vocab, 4)(ids)
    x = x + jax.random.normal(self.make_rng('noise'), x.shape)
    return nn.Dense(3)(x)


class UsesUnknownLayer(nn.Module):
  """A Flax layer the port has no NNX counterpart for."""

  @nn.compact
  def __call__(self, x):
    return nn.SpectralNorm(nn.Dense(3))(x, update_stats=False)


class DependsOnInputs(nn.Module):
  """Creates a layer only for wide inputs: a condition NNX cannot replay."""

  @nn.compact
  def __call__(self, x):
    if x.shape[-1] > 2:
      x = nn.Dense(2)(x)
    return nn.Dense(1)(x)


class SetupStack(nn.Module):
  """The `setup()` style: heads in a list, a parameter, a norm, and a
  dropout whose mode comes with the call."""

  num_heads: int = 3
  head_dim: int = 4
  out: int = 2

  def setup(self):
    # NNX keeps these attribute names; a list becomes an nnx.List.
    self.heads = [nn.Dense(self.head_dim) for _ in range(self.num_heads)]
    self.bias = self.param('bias', nn.initializers.zeros, (self.out,))
    self.norm = nn.LayerNorm()
    self.dropout = nn.Dropout(0.5)
    self.head = nn.Dense(self.out)

  def __call__(self, x, *, deterministic: bool = True):
    x = jnp.concatenate([head(x) for head in self.heads], axis=-1)
    x = self.dropout(self.norm(x), deterministic=deterministic)
    return self.head(x) + self.bias

  def first_head(self, x):
    """A second method, kept."""
    return self.heads[0](x)


def stack(widths=(8, 12), features: int = 5) -> LinenModel:
  return LinenModel(Stack(StackConfig(widths)), jnp.ones((4, features)), train=False)


def tower(width: int = 6, hidden: int = 10, depth: int = 2) -> LinenModel:
  return LinenModel(Tower(11, width, hidden, depth), jnp.zeros((2, 5), jnp.int32))


def scaled(features: int = 3) -> LinenModel:
  return LinenModel(Scaled(), jnp.ones((2, features)))


def counts(features: int = 2) -> LinenModel:
  return LinenModel(Counts(features), jnp.ones((2, 3)))


def uses_make_rng() -> LinenModel:
  return LinenModel(UsesMakeRng(), jnp.ones((2, 3)))


def scanned_noise() -> LinenModel:
  return LinenModel(ScannedNoise(), jnp.ones((2, 3)))


def noisy_embedder() -> LinenModel:
  return LinenModel(NoisyEmbedder(), jnp.zeros((2, 5), jnp.int32), train=False)


def uses_unknown_layer() -> LinenModel:
  return LinenModel(UsesUnknownLayer(), jnp.ones((2, 3)))


def depends_on_inputs() -> LinenModel:
  return LinenModel(DependsOnInputs(), jnp.ones((2, 3)))


def failing() -> LinenModel:
  raise RuntimeError('the factory broke')


def setup_stack(num_heads: int = 3, head_dim: int = 4, width: int = 5) -> LinenModel:
  return LinenModel(SetupStack(num_heads, head_dim), jnp.ones((3, width)), deterministic=True)


# What an adversarial review found; each is ported right, or refused.


class StepwiseLocal(nn.Module):
  """A layer argument computed in steps, in a block that creates nothing."""

  features: int = 8
  grouped: bool = False

  @nn.compact
  def __call__(self, x):
    groups = 1
    if self.grouped:
      groups = 4
    x = nn.Dense(self.features)(x)
    return nn.GroupNorm(num_groups=groups)(x)


class Fuse(nn.Module):
  """A condition on two inputs' sizes."""

  features: int = 6

  @nn.compact
  def __call__(self, x, y):
    if x.shape[-1] != y.shape[-1]:
      x = nn.Dense(y.shape[-1])(x)
    return nn.Dense(self.features)(x + y)


class TwoStreams(nn.Module):
  """Two chains of layers in one loop."""

  n: int = 1

  @nn.compact
  def __call__(self, x, y):
    for _ in range(self.n):
      x = nn.Dense(4)(x)
      y = nn.Dense(4)(y)
    return x + y


class Tiled(nn.Module):
  """A size that grows as 2 ** n of a count: no fit writes it."""

  n: int = 2

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(jnp.tile(x, (1, 2**self.n)))


class TiledTwice(nn.Module):
  features: int = 3

  @nn.compact
  def __call__(self, x):
    return Tiled(2)(x) + Tiled(n=2)(x)


class Awkward(nn.Module):
  """A keyword as a name, a positional `use_bias`, an enumerate target, a
  loop variable read after its loop, a `dataclasses.field` default."""

  widths: tuple[int, ...] = dataclasses.field(default=(4, 4))

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(4, False, name='class')(x)
    for i, w in enumerate(self.widths):
      x = nn.Dense(w)(x) * (i + 1)
    return x / (i + 1)


class ChannelsFirst(nn.Module):
  """A BatchNorm over axis 1."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(4, (3, 3))(x)
    x = jnp.transpose(x, (0, 3, 1, 2))
    return nn.BatchNorm(use_running_average=not train, axis=1)(x)


def stepwise_local() -> LinenModel:
  return LinenModel(StepwiseLocal(), jnp.ones((2, 5)))


def fuse() -> LinenModel:
  return LinenModel(Fuse(), jnp.ones((2, 4)), jnp.ones((2, 6)))


def two_streams() -> LinenModel:
  return LinenModel(TwoStreams(1), jnp.ones((2, 4)), jnp.ones((2, 4)))


def tiled_twice() -> LinenModel:
  return LinenModel(TiledTwice(), jnp.ones((2, 3)))


def awkward() -> LinenModel:
  return LinenModel(Awkward(), jnp.ones((2, 4)))


def channels_first(size: int = 4) -> LinenModel:
  return LinenModel(ChannelsFirst(), jnp.ones((2, size, size, 3)), train=False)


class Inner(nn.Module):
  """A dense layer and a dropout, whose mode a field sets."""

  features: int
  deterministic: bool = True

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.features)(x)
    return nn.Dropout(0.5, deterministic=self.deterministic)(x)


class HandsOnModes(nn.Module):
  """`train` handed down as fields: `deterministic=not train` to a block,
  which hands its own `deterministic` to its dropout and to `Inner`."""

  features: int
  deterministic: bool = True

  @nn.compact
  def __call__(self, x):
    x = Inner(self.features, self.deterministic, name='inner')(x)
    x = nn.Dropout(0.25)(x, deterministic=self.deterministic)
    return nn.Dense(self.features, name='out')(x)


class ModesByField(nn.Module):
  features: int = 6

  @nn.compact
  def __call__(self, x, train: bool = False):
    return HandsOnModes(self.features, deterministic=not train)(x)


class ReadsItsModeField(nn.Module):
  """Its `deterministic` sets a dropout and is read as a number too."""

  deterministic: bool = True

  @nn.compact
  def __call__(self, x):
    x = nn.Dropout(0.5, deterministic=self.deterministic)(x)
    return x * self.deterministic


def modes_by_field(features: int = 6) -> LinenModel:
  return LinenModel(ModesByField(features), jnp.ones((2, 3)))


def hands_on_modes() -> LinenModel:
  return LinenModel(HandsOnModes(4, deterministic=False), jnp.ones((2, 3)))


def reads_its_mode_field() -> LinenModel:
  return LinenModel(ReadsItsModeField(), jnp.ones((2, 3)))


def _norm(kind: str, name: str) -> nn.Module:
  """The norm `kind` names: a helper beside the classes, as real code has."""
  if kind == 'rms':
    return nn.RMSNorm(name=name)
  return nn.LayerNorm(epsilon=1e-5, name=name)


def _projection(features: int) -> nn.Module:
  return nn.Dense(features, use_bias=False)


def _spectral(features: int) -> nn.Module:
  return nn.SpectralNorm(nn.Dense(features))


class NormedBlock(nn.Module):
  """Layers made by the file's functions, named by an argument or not."""

  kind: str = 'layer'
  features: int = 5

  @nn.compact
  def __call__(self, x):
    x = _norm(self.kind, 'pre_norm')(x)
    x = _projection(self.features)(x)
    x = _projection(self.features + 1)(x)
    return _norm(self.kind, name='post_norm')(x)


def normed_block(kind: str = 'layer', features: int = 5) -> LinenModel:
  return LinenModel(NormedBlock(kind, features), jnp.ones((2, 3)))


def normed_rms() -> LinenModel:
  return normed_block('rms')


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  width: int = 8
  heads: int = 2
  hidden: int = 12
  layers: int = 2
  vocab: int = 11


class AttentionBlock(nn.Module):
  """Self-attention and an MLP with residuals: the input is `config.width`
  wide because the residual says so, not because a layer was told."""

  config: AttentionConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, mask=None):
    c = self.config
    y = nn.LayerNorm()(x)
    y = nn.MultiHeadDotProductAttention(
        num_heads=c.heads, qkv_features=c.width, dropout_rate=0.1, deterministic=self.deterministic,
        kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ('embed', 'kv')),
    )(y, mask=mask)
    x = x + y
    y = nn.Dense(c.hidden, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model')))(x)
    return x + nn.Dense(c.width, use_bias=False)(nn.gelu(y))


class Encoder(nn.Module):
  config: AttentionConfig

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    x = nn.Embed(self.config.vocab, self.config.width)(tokens)
    mask = nn.make_causal_mask(tokens)
    for _ in range(self.config.layers):
      x = AttentionBlock(self.config, deterministic=not train)(x, mask)
    return x


class CrossAttention(nn.Module):
  @nn.compact
  def __call__(self, x, context):
    return nn.MultiHeadDotProductAttention(num_heads=2)(x, context)


class KvByKeyword(nn.Module):
  @nn.compact
  def __call__(self, x, context):
    return nn.MultiHeadDotProductAttention(num_heads=2)(x, inputs_kv=context)


def kv_by_keyword() -> LinenModel:
  return LinenModel(KvByKeyword(), jnp.ones((2, 3, 4)), jnp.ones((2, 6, 5)))


def encoder(width: int = 8, heads: int = 2) -> LinenModel:
  return LinenModel(Encoder(AttentionConfig(width=width, heads=heads)), jnp.zeros((2, 5), jnp.int32))


def cross_attention() -> LinenModel:
  return LinenModel(CrossAttention(), jnp.ones((2, 3, 4)), jnp.ones((2, 6, 5)))


@dataclasses.dataclass(frozen=True)
class ScanConfig:
  width: int = 6
  hidden: int = 10
  layers: int = 3
  scan: bool = False


class ResidualLayer(nn.Module):
  """Returns `(x, None)`, as `nn.scan` wants: the carry and nothing stacked."""

  config: ScanConfig

  @nn.compact
  def __call__(self, x, scale):
    y = nn.Dense(self.config.hidden, kernel_init=nn.with_partitioning(
        nn.initializers.lecun_normal(), (None, 'model')))(nn.LayerNorm()(x))
    return x + scale * nn.Dense(self.config.width)(nn.relu(y)), None


class ScannedOrLooped(nn.Module):
  """Its layers in a Python loop, or scanned under remat (`config.scan`)."""

  config: ScanConfig

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.config.width)(x)
    scale = jnp.float32(0.5)
    if self.config.scan:
      layers = nn.scan(
          nn.remat(ResidualLayer, prevent_cse=False),
          variable_axes={'params': 0},
          split_rngs={'params': True},
          in_axes=nn.broadcast,
          length=self.config.layers,
          metadata_params={nn.PARTITION_NAME: 'layers'},
      )
      x, _ = layers(self.config)(x, scale)
    else:
      for _ in range(self.config.layers):
        x, _ = ResidualLayer(self.config)(x, scale)
    return x


def scanned_or_looped(scan: bool = False) -> LinenModel:
  return LinenModel(ScannedOrLooped(ScanConfig(scan=scan)), jnp.ones((2, 4)))


@dataclasses.dataclass(frozen=True)
class FlagsConfig:
  """Modes and options in the configuration, as Flax's lm1b keeps them."""

  width: int = 6
  layers: int = 2
  deterministic: bool = True
  bias_init: Any = None  # a learned bias if given, else none


class Numbered(nn.Module):
  config: FlagsConfig

  @nn.compact
  def __call__(self, x):
    config = self.config
    bias_shape = (x.shape[-1],)
    if config.bias_init is None:
      bias = jnp.zeros(bias_shape)
    else:
      bias = self.param('bias', config.bias_init, bias_shape)
    x = x + bias
    for i in range(config.layers):
      x = nn.Dense(config.width, name=f'layer_{i}')(x)
      x = nn.Dropout(0.5)(x, deterministic=config.deterministic)
    return x


def numbered(bias_init=None) -> LinenModel:
  return LinenModel(Numbered(FlagsConfig(bias_init=bias_init)), jnp.ones((2, 3)))


# Found by an adversarial review: each was reported proven, or crashed, and
# is now refused with a stub that says why.


@dataclasses.dataclass(frozen=True)
class HostileConfig:
  width: int = 4
  extra: bool = False
  deep: bool = False
  deterministic: bool = True
  use_running_average: bool = True
  bias_init: Any = None


class UntracedAfterRebinding(nn.Module):
  """A param of a branch only `bias_init` given a value takes, shaped by `x` after `x` is rebound."""

  config: HostileConfig

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.config.width)(x)
    if self.config.bias_init is None:
      bias = jnp.zeros((x.shape[-1],))
    else:
      bias = self.param('bias', self.config.bias_init, (x.shape[-1],))
    return x + bias


class UntracedCreation(nn.Module):
  """A module under two flags together, which no single flip takes."""

  config: HostileConfig

  @nn.compact
  def __call__(self, x):
    x = Inner(self.config.width)(x)
    if self.config.extra and self.config.deep:
      x = Inner(self.config.width)(x)
    return x


class MixedModes(nn.Module):
  """Batch statistics from the configuration, dropout from the call."""

  config: HostileConfig

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.BatchNorm(use_running_average=self.config.use_running_average)(nn.Dense(self.config.width)(x))
    return nn.Dropout(0.5)(x, deterministic=not train)


class DottedModeArithmetic(nn.Module):
  config: HostileConfig

  @nn.compact
  def __call__(self, x):
    config = self.config
    x = nn.Dropout(0.5)(nn.Dense(config.width)(x), deterministic=config.deterministic)
    return x * (1.0 + config.deterministic)


class VmapAlone(nn.Module):
  @nn.compact
  def __call__(self, x):
    block = nn.vmap(Inner, variable_axes={'params': None}, split_rngs={'params': False})
    return block(3)(x)


def untraced_after_rebinding() -> LinenModel:
  return LinenModel(UntracedAfterRebinding(HostileConfig()), jnp.ones((2, 3)))


def untraced_creation() -> LinenModel:
  return LinenModel(UntracedCreation(HostileConfig()), jnp.ones((2, 3)))


def mixed_modes() -> LinenModel:
  return LinenModel(MixedModes(HostileConfig()), jnp.ones((4, 3)), train=False)


def dotted_mode_arithmetic() -> LinenModel:
  return LinenModel(DottedModeArithmetic(HostileConfig()), jnp.ones((2, 3)))


def vmap_alone() -> LinenModel:
  return LinenModel(VmapAlone(), jnp.ones((2, 3)))


class HalfWidth(nn.Module):
  """A gated unit: the layer's input is half the input's width."""

  features: int = 3

  @nn.compact
  def __call__(self, x):
    a, b = jnp.split(x, 2, axis=-1)
    return nn.Dense(self.features)(a * nn.sigmoid(b))


class Chunks(nn.Module):
  """An input as wide as `n` by coincidence: not tied to it."""

  n: int = 3
  features: int = 5

  @nn.compact
  def __call__(self, x):
    first = jnp.split(x, self.n, axis=-1)[0]
    return nn.Dense(self.features)(x) + nn.Dense(self.features)(first)


def half_width() -> LinenModel:
  return LinenModel(HalfWidth(), jnp.ones((2, 6)))


def chunks() -> LinenModel:
  return LinenModel(Chunks(), jnp.ones((2, 3)))


class Floored(nn.Module):
  """A width with a floor: linear near the traced width, not below 16."""

  width: int = 32

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(nn.Dense(max(self.width, 16))(x))


class Capped(nn.Module):
  """A width with a cap: linear near the traced width, not above 64."""

  width: int = 32

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(nn.Dense(min(self.width, 64))(x))


def floored() -> LinenModel:
  return LinenModel(Floored(), jnp.ones((2, 4)))


def capped() -> LinenModel:
  return LinenModel(Capped(), jnp.ones((2, 4)))


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  width: int = 8
  heads: int = 2
  hidden: int = 12
  layers: int = 2
  vocab: int = 13
  max_len: int = 6
  scan: bool = False


class Position(nn.Module):
  """Learned positions; decoding, the position of the index it keeps in the
  cache (Linen's idiom: `init` makes the index, later calls advance it)."""

  max_len: int
  width: int
  decode: bool = False

  @nn.compact
  def __call__(self, x):
    table = self.param('table', nn.initializers.normal(0.02), (self.max_len, self.width))
    if self.decode:
      is_initialized = self.has_variable('cache', 'index')
      index = self.variable('cache', 'index', lambda: jnp.array(0, jnp.uint32))
      if is_initialized:
        i = index.value
        index.value = i + 1
        return x + jax.lax.dynamic_slice_in_dim(table, i, 1)[None]
    return x + table[None, : x.shape[1]]


class DecoderBlock(nn.Module):
  config: DecoderConfig
  decode: bool = False

  @nn.compact
  def __call__(self, x, mask):
    c = self.config
    y = nn.MultiHeadDotProductAttention(num_heads=c.heads, qkv_features=c.width, decode=self.decode)(
        nn.LayerNorm()(x), mask=mask)
    x = x + y
    return x + nn.Dense(c.width)(nn.gelu(nn.Dense(c.hidden)(x))), None


class Decoder(nn.Module):
  """A causal LM that decodes one token at a time with `decode=True`, its
  blocks looped or scanned (`config.scan`)."""

  config: DecoderConfig
  decode: bool = False

  @nn.compact
  def __call__(self, tokens):
    c = self.config
    x = nn.Embed(c.vocab, c.width)(tokens)
    x = Position(c.max_len, c.width, self.decode)(x)
    mask = None if self.decode else nn.make_causal_mask(tokens)
    if c.scan:
      blocks = nn.scan(
          DecoderBlock, variable_axes={'params': 0, 'cache': 0}, split_rngs={'params': True},
          in_axes=nn.broadcast, length=c.layers,
      )
      x, _ = blocks(c, self.decode)(x, mask)
    else:
      for _ in range(c.layers):
        x, _ = DecoderBlock(c, self.decode)(x, mask)
    return nn.Dense(c.vocab)(x)


def decoder(decode: bool = False, scan: bool = False) -> LinenModel:
  return LinenModel(Decoder(DecoderConfig(scan=scan), decode=decode), jnp.zeros((2, 6), jnp.int32))


def decoder_decoding() -> LinenModel:
  """The decoder as given to decode: its whole-sequence call is the flip."""
  return decoder(decode=True)


class BatchNormed(nn.Module):
  """A layer normalised by batch statistics (a collection a `TrainState`
  carries) with dropout after it, trained with `train=True`."""

  features: int = 6

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(self.features)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.Dropout(0.3, deterministic=not train)(nn.relu(x))
    return nn.Dense(3)(x)


def batch_normed() -> LinenModel:
  return LinenModel(BatchNormed(), jnp.ones((4, 5)), train=False)


# The zoo's models and Flax's lm1b, as `linen-nnx port` and the test files
# it writes take them (`pkg.module:function`).


def zoo_cnn() -> LinenModel:
  from model_zoo import configs
  from model_zoo.linen import cnn

  c = configs.CNNConfig()
  return LinenModel(cnn.CNN(c), jnp.ones((2, c.image_size, c.image_size, c.in_channels)), train=False)


def zoo_resnet() -> LinenModel:
  from model_zoo import configs
  from model_zoo.linen import resnet

  c = configs.ResNetConfig()
  return LinenModel(resnet.ResNet(c), jnp.ones((2, 16, 16, c.in_channels)), train=False)


def zoo_rnn() -> LinenModel:
  from model_zoo import configs
  from model_zoo.linen import rnn

  return LinenModel(rnn.RNNLM(configs.RNNConfig()), jnp.zeros((2, 5), jnp.int32))


def zoo_transformer() -> LinenModel:
  from model_zoo import configs
  from model_zoo.linen import transformer

  return LinenModel(transformer.TransformerLM(configs.TransformerConfig()), jnp.zeros((2, 8), jnp.int32))


def flax_lm1b() -> LinenModel:
  from tests.third_party.flax_lm1b import linen_models as lm1b

  config = lm1b.TransformerConfig(vocab_size=32, output_vocab_size=32, emb_dim=16, num_heads=2,
                                  num_layers=2, qkv_dim=16, mlp_dim=32, max_len=16)
  return LinenModel(lm1b.TransformerLM(config), jnp.zeros((2, 8), jnp.int32))


def flax_imagenet(block: str = 'ResNetBlock', stage_sizes: tuple[int, ...] = (1, 1)) -> LinenModel:
  """Flax's imagenet ResNet, small: two stages of one block (the second
  with the shortcut), eight filters."""
  from tests.third_party.flax_imagenet import linen_models as imagenet

  model = imagenet.ResNet(stage_sizes=list(stage_sizes), block_cls=getattr(imagenet, block), num_classes=10,
                          num_filters=8)
  return LinenModel(model, jnp.ones((2, 32, 32, 3)), train=False)


def flax_imagenet_bottleneck() -> LinenModel:
  return flax_imagenet('BottleneckResNetBlock')


def flax_imagenet_bottleneck_two_one() -> LinenModel:
  """Bottlenecks, two in the first stage: blocks with and without their
  shortcut, traced apart, take the same input axis."""
  return flax_imagenet('BottleneckResNetBlock', (2, 1))


def flax_imagenet_two_blocks_a_stage() -> LinenModel:
  """ResNet18's shape, two stages long: blocks move to another stage when a
  stage is longer."""
  return flax_imagenet('ResNetBlock', (2, 2))


def flax_imagenet_block() -> LinenModel:
  """Flax's imagenet ResNet block alone, given its factories (a layer norm:
  a BatchNorm's mode fixed in a partial is refused), with strides of two:
  its shortcut exists whatever its input width."""
  from tests.third_party.flax_imagenet import linen_models as imagenet

  conv = functools.partial(nn.Conv, use_bias=False)
  norm = functools.partial(nn.LayerNorm, epsilon=1e-5)
  block = imagenet.ResNetBlock(8, conv=conv, norm=norm, act=nn.relu, strides=(2, 2))
  return LinenModel(block, jnp.ones((2, 16, 16, 4)))


def flax_sst2_bilstm() -> LinenModel:
  """Flax's sst2 bidirectional LSTM: its `SimpleLSTM` scans `__call__` over
  the time axis (`nn.transforms.scan`, parameters broadcast) and makes a
  throwaway cell for its carry."""
  from tests.third_party.flax_sst2 import linen_models as sst2

  return LinenModel(sst2.SimpleBiLSTM(hidden_size=6), jnp.ones((2, 5, 4)), jnp.array([5, 3]))


def flax_sst2() -> LinenModel:
  """Flax's sst2 text classifier, configured deterministic (its field, which
  every class merges with its call's argument)."""
  from tests.third_party.flax_sst2 import linen_models as sst2

  model = sst2.TextClassifier(embedding_size=8, hidden_size=6, vocab_size=20, output_size=2, dropout_rate=0.1,
                              word_dropout_rate=0.1, unk_idx=1, deterministic=True)
  return LinenModel(model, jnp.zeros((2, 5), jnp.int32), jnp.array([5, 3]))


def flax_sst2_by_its_call() -> LinenModel:
  """Flax's sst2 text classifier given `deterministic` at its call, as its
  training loop gives it: the proof turns it round (dropout, word dropout)."""
  from tests.third_party.flax_sst2 import linen_models as sst2

  model = sst2.TextClassifier(embedding_size=8, hidden_size=6, vocab_size=20, output_size=2, dropout_rate=0.1,
                              word_dropout_rate=0.1, unk_idx=1)
  return LinenModel(model, jnp.zeros((2, 5), jnp.int32), jnp.array([5, 3]), deterministic=True)


class ScaledByDefault(nn.Module):
  """A field whose default Linen computes with the class."""

  w_init: Any = nn.initializers.normal(0.1)

  @nn.compact
  def __call__(self, x):
    return x * self.param('w', self.w_init, (x.shape[-1],))


class ScaledTwiceByDefault(nn.Module):
  """A field of the same name, another computed default."""

  w_init: Any = nn.initializers.normal(0.2)

  @nn.compact
  def __call__(self, x):
    return ScaledByDefault()(x) * self.param('w', self.w_init, (x.shape[-1],))


def scaled_by_defaults() -> LinenModel:
  return LinenModel(ScaledTwiceByDefault(), jnp.ones((2, 3)))


class ScannedOverTime(nn.Module):
  """A cell scanned over the inputs' time axis by a decorator of its call,
  as Flax's sst2 writes it, with the settings a test changes."""

  features: int

  @functools.partial(nn.scan, variable_broadcast='params', in_axes=1, out_axes=1,
                     split_rngs={'params': False})
  @nn.compact
  def __call__(self, carry, x):
    return nn.LSTMCell(self.features)(carry, x)


def _lstm_carry(features: int = 5):
  return jnp.zeros((2, features)), jnp.zeros((2, features))


class OverTime(nn.Module):
  """Runs `ScannedOverTime` from a zero carry of its width."""

  features: int

  @nn.compact
  def __call__(self, x):
    carry = (jnp.zeros(x.shape[:1] + (self.features,)),) * 2
    return ScannedOverTime(self.features)(carry, x)[1]


def scanned_over_time(features: int = 5) -> LinenModel:
  return LinenModel(OverTime(features), jnp.ones((2, 3, 4)))


class ScannedWithDropout(nn.Module):
  """Dropout under a scan of the call: its keys are split per step."""

  @functools.partial(nn.scan, variable_broadcast='params', in_axes=1, out_axes=1,
                     split_rngs={'params': False, 'dropout': True})
  @nn.compact
  def __call__(self, carry, x):
    carry, y = nn.LSTMCell(5)(carry, x)
    return carry, nn.Dropout(0.5, deterministic=False)(y)


def scanned_with_dropout() -> LinenModel:
  return LinenModel(ScannedWithDropout(), _lstm_carry(), jnp.ones((2, 3, 4)))


class ScannedParamsPerStep(nn.Module):
  """Parameters of their own at every step (`variable_axes`), not broadcast."""

  @functools.partial(nn.scan, variable_axes={'params': 1}, in_axes=1, out_axes=1,
                     split_rngs={'params': True})
  @nn.compact
  def __call__(self, carry, x):
    return nn.LSTMCell(5)(carry, x)


def scanned_params_per_step() -> LinenModel:
  return LinenModel(ScannedParamsPerStep(), _lstm_carry(), jnp.ones((2, 3, 4)))


class UncalledScan(nn.Module):
  """A method scanned by a decorator that the model never calls."""

  @functools.partial(nn.scan, variable_broadcast='params', in_axes=1, out_axes=1,
                     split_rngs={'params': False})
  def unused(self, carry, x):
    return carry, x

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x)


def uncalled_scan() -> LinenModel:
  return LinenModel(UncalledScan(), jnp.ones((2, 4)))


class ScannedWithBroadcastOutput(nn.Module):
  """A scan of the call with an output not scanned (`nn.broadcast`)."""

  @functools.partial(nn.scan, variable_broadcast='params', in_axes=1, out_axes=(1, nn.broadcast),
                     split_rngs={'params': False})
  @nn.compact
  def __call__(self, carry, x):
    carry, y = nn.LSTMCell(5)(carry, x)
    return carry, (y, jnp.ones(3))


def scanned_with_broadcast_output() -> LinenModel:
  return LinenModel(ScannedWithBroadcastOutput(), _lstm_carry(), jnp.ones((2, 3, 4)))


class DropoutByField(nn.Module):
  """A merged flag configured False: training by the configuration."""

  deterministic: bool | None = None

  @nn.compact
  def __call__(self, x, deterministic: bool | None = None):
    deterministic = nn.module.merge_param('deterministic', self.deterministic, deterministic)
    return nn.Dropout(0.5)(nn.Dense(4)(x), deterministic=deterministic)


def dropout_by_field() -> LinenModel:
  return LinenModel(DropoutByField(deterministic=False), jnp.ones((2, 3)))


class Counter(nn.Module):
  """Advances its cache index in every call, `init`'s too (no
  `has_variable` guard): Linen's `init` leaves the index at 1."""

  decode: bool = False

  @nn.compact
  def __call__(self, x):
    table = self.param('table', nn.initializers.normal(1.0), (8, 3))
    if self.decode:
      index = self.variable('cache', 'index', lambda: jnp.array(0, jnp.int32))
      i = index.value
      index.value = i + 1
      return x + jax.lax.dynamic_slice_in_dim(table, i, 1)[None]
    return x + table[None, : x.shape[1]]


def counter(decode: bool = False) -> LinenModel:
  return LinenModel(Counter(decode=decode), jnp.ones((2, 4, 3)))


class LayerFromField(nn.Module):
  """A layer made by a field holding a module class (Flax's imagenet's
  `conv`, `block_cls`): the port makes it through the field, which holds
  NNX's class (`nnx.Linear` by default)."""

  layer: Any = nn.Dense

  @nn.compact
  def __call__(self, x):
    return self.layer(4)(x)


def layer_from_field() -> LinenModel:
  return LinenModel(LayerFromField(), jnp.ones((2, 3)))


def layer_from_partial_field() -> LinenModel:
  """The field holding a partial with settings of its own."""
  return LinenModel(LayerFromField(layer=functools.partial(nn.Dense, use_bias=False)), jnp.ones((2, 3)))


class OtherDefault(nn.Module):
  """A field whose default (a convolution) takes other arguments than the
  layer the traced configuration makes with it (a dense layer)."""

  layer: Any = nn.Conv

  @nn.compact
  def __call__(self, x):
    return self.layer(4)(x)


def other_default() -> LinenModel:
  return LinenModel(OtherDefault(layer=nn.Dense), jnp.ones((2, 3)))


def positional_partial_field() -> LinenModel:
  """The field holding a partial that gives the width by position: NNX's
  constructor takes the input size before it."""
  return LinenModel(LayerFromField(layer=functools.partial(nn.Conv, 4)), jnp.ones((2, 5, 3)))


class Widening(nn.Module):
  """A bottleneck-like block whose shortcut exists where its input is not
  four times `width` wide, made through the norm and dense factories it is
  given, in a stack that hands them on (as Flax's imagenet ResNet does)."""

  width: int
  dense: Any
  norm: Any

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.dense(self.width)(x)
    y = self.norm()(y)
    y = self.dense(self.width * 4)(nn.relu(y))
    if residual.shape != y.shape:
      residual = self.dense(self.width * 4, name='projection')(residual)
    return residual + y


class WideningStack(nn.Module):
  widths: tuple[int, ...] = (2, 3)
  block: Any = Widening

  @nn.compact
  def __call__(self, x, train: bool = False):
    dense = functools.partial(nn.Dense, use_bias=False)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.8, axis_name='batch')
    for width in self.widths:
      x = self.block(width, dense=dense, norm=norm)(x)
    return nn.Dense(3)(x)


def widening_stack() -> LinenModel:
  return LinenModel(WideningStack(), jnp.ones((4, 8)), train=False)


class Cell(nn.RNNCellBase):
  """A cell of the user's own, which Linen calls only inside `nn.RNN`'s scan."""

  features: int = 4

  @nn.compact
  def __call__(self, carry, x):
    h = nn.tanh(nn.Dense(self.features)(jnp.concatenate([carry, x], -1)))
    return h, h

  def initialize_carry(self, rng, input_shape):
    return jnp.zeros(input_shape[:-1] + (self.features,))

  @property
  def num_feature_axes(self) -> int:
    return 1


class CellUnderRNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.RNN(Cell())(x)


def cell_under_rnn() -> LinenModel:
  return LinenModel(CellUnderRNN(), jnp.ones((2, 5, 3)))


@dataclasses.dataclass(frozen=True)
class NormConfig:
  width: int = 4
  norm: Any = nn.LayerNorm


class NormFromConfig(nn.Module):
  """A layer class held inside the configuration: written as the traced
  class, the port would ignore what the configuration holds."""

  config: NormConfig

  @nn.compact
  def __call__(self, x):
    return self.config.norm()(nn.Dense(self.config.width)(x))


def norm_from_config() -> LinenModel:
  return LinenModel(NormFromConfig(NormConfig(norm=nn.RMSNorm)), jnp.ones((2, 3)))


class NormField(nn.Module):
  norm: Any = nn.BatchNorm

  @nn.compact
  def __call__(self, x):
    return self.norm()(nn.Dense(4)(x))


def mode_in_field() -> LinenModel:
  """Running averages always, fixed in the partial: NNX sets that mode for
  every layer, so the port cannot keep it."""
  return LinenModel(NormField(norm=functools.partial(nn.BatchNorm, use_running_average=True)), jnp.ones((4, 3)))


def linen_only_argument_in_field() -> LinenModel:
  return LinenModel(LayerFromField(layer=functools.partial(nn.Dense, dot_general_cls=None)), jnp.ones((2, 3)))


DENSE_WITHOUT_BIAS = functools.partial(nn.Dense, use_bias=False)


class PartialDefault(nn.Module):
  layer: Any = DENSE_WITHOUT_BIAS

  @nn.compact
  def __call__(self, x):
    return self.layer(4)(x)


def partial_default() -> LinenModel:
  return LinenModel(PartialDefault(), jnp.ones((2, 3)))


class AttentionFromField(nn.Module):
  """Attention through a field: NNX's wants `decode` where Linen defaults
  it, which the field's partial may set."""

  attention: Any = nn.MultiHeadDotProductAttention

  @nn.compact
  def __call__(self, x):
    return self.attention(num_heads=2)(x)


def attention_from_field() -> LinenModel:
  return LinenModel(AttentionFromField(), jnp.ones((2, 3, 4)))


class PartialOfPartial(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    base = functools.partial(nn.BatchNorm, momentum=0.5)
    norm = functools.partial(base, use_running_average=not train)
    return NormField(norm=norm)(nn.Dense(4)(x))


def partial_of_partial() -> LinenModel:
  return LinenModel(PartialOfPartial(), jnp.ones((4, 3)), train=False)


class TiledBy(nn.Module):
  """Takes a count beside its array (a Python value the code tiles by);
  `x` is bound to a layer whose mode `train` sets (not an alias of it)."""

  @nn.compact
  def __call__(self, x, times, train: bool = False):
    x = nn.BatchNorm(use_running_average=not train)(nn.Dense(4)(x))
    return jnp.tile(x, (1, times))


def tiled_by() -> LinenModel:
  return LinenModel(TiledBy(), jnp.ones((4, 3)), 2, train=False)


class NormOverReplicas(nn.Module):
  """A LayerNorm averaging over a mapped axis in every call: Linen's own
  `init` fails outside `pmap`, as the port traces it."""

  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm(axis_name='batch')(nn.Dense(4)(x))


def norm_over_replicas() -> LinenModel:
  return LinenModel(NormOverReplicas(), jnp.ones((2, 3)))


class HandsOnAClass(nn.Module):
  """Hands Flax's layer class itself to a block that makes its layer with it."""

  @nn.compact
  def __call__(self, x):
    x = LayerFromField(layer=nn.Dense)(x)
    return LayerFromField(nn.Dense)(x)


def hands_on_a_class() -> LinenModel:
  return LinenModel(HandsOnAClass(), jnp.ones((2, 3)))


class HandsOnPartials(nn.Module):
  """Hands partials of Flax's layers written in place, one with its mode."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = LayerFromField(layer=functools.partial(nn.Dense, use_bias=False))(x)
    return NormField(norm=functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.8))(x)


def hands_on_partials() -> LinenModel:
  return LinenModel(HandsOnPartials(), jnp.ones((4, 3)), train=False)


class MergedFlag(nn.Module):
  """Flax's sst2 way of taking a flag from the field or the call
  (`nn.module.merge_param`): kept as it is, a function of Python values."""

  plain: bool | None = None

  @nn.compact
  def __call__(self, x, plain: bool | None = None):
    plain = nn.module.merge_param('plain', self.plain, plain)
    x = nn.Dense(3)(x)
    return x if plain else x * 2


def merged_flag() -> LinenModel:
  return LinenModel(MergedFlag(), jnp.ones((2, 3)), plain=True)


class FlagNamedAsAMode(nn.Module):
  """A field named as NNX's modes, merged with the call's flag, that sets no
  layer's mode: kept, as NNX's layers keep theirs (`.eval()` sets it)."""

  deterministic: bool | None = None

  @nn.compact
  def __call__(self, x, deterministic: bool | None = None):
    deterministic = nn.module.merge_param('deterministic', self.deterministic, deterministic)
    return nn.Dense(3)(x) * (1 if deterministic else 2)


def flag_named_as_a_mode() -> LinenModel:
  return LinenModel(FlagNamedAsAMode(), jnp.ones((2, 3)), deterministic=True)


class OptionalOut(nn.Module):
  """Flax nlp_seq's `MlpBlock`: the output as wide as the input unless
  `out_dim` is given (the traced configuration leaves it None)."""

  mlp_dim: int = 8
  out_dim: int | None = None

  @nn.compact
  def __call__(self, x):
    out_dim = x.shape[-1] if self.out_dim is None else self.out_dim
    return nn.Dense(out_dim)(nn.relu(nn.Dense(self.mlp_dim)(x)))


def optional_out() -> LinenModel:
  return LinenModel(OptionalOut(), jax.ShapeDtypeStruct((2, 5, 6), jnp.float32))


class TwoModeFlags(nn.Module):
  """Dropout by `train`, batch statistics by `update_stats`: frozen
  statistics while fine-tuning, a state NNX's one mode cannot give."""

  @nn.compact
  def __call__(self, x, train: bool = False, update_stats: bool = False):
    x = nn.BatchNorm(use_running_average=not update_stats)(nn.Dense(4)(x))
    return nn.Dropout(0.5, deterministic=not train)(x)


def two_mode_flags() -> LinenModel:
  return LinenModel(TwoModeFlags(), jnp.ones((2, 3)), train=False, update_stats=False)


class ValidatedOut(nn.Module):
  """A field left None that its own `__post_init__` checks when given:
  values it refuses are skipped, the first it takes proven."""

  out_dim: int | None = None

  def __post_init__(self):
    if self.out_dim is not None and self.out_dim % 8:
      raise ValueError('out_dim must be a multiple of 8')
    super().__post_init__()

  @nn.compact
  def __call__(self, x):
    return nn.Dense(x.shape[-1] if self.out_dim is None else self.out_dim)(x)


def validated_out() -> LinenModel:
  return LinenModel(ValidatedOut(), jax.ShapeDtypeStruct((2, 6), jnp.float32))


class FloatFields(nn.Module):
  """Floats of the configuration: a scale and a normalisation's epsilon."""

  scale: float = 0.5
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm(epsilon=self.epsilon)(nn.Dense(4)(x)) * self.scale


def float_fields() -> LinenModel:
  return LinenModel(FloatFields(), jax.ShapeDtypeStruct((2, 3), jnp.float32))


class LoopBetweenLayers(nn.Module):
  """A `Dense` before the loop's and two after: Linen numbers the loop's
  from 1 and the last two after it (`Dense_{i+1}`, `Dense_{n}`, `Dense_{n+1}`)."""

  widths: tuple[int, ...] = (6, 6)

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(5)(x)
    for width in self.widths:
      x = nn.relu(nn.Dense(width)(x))
    x = nn.Dense(4)(x)
    return nn.Dense(3)(x)


def loop_between_layers() -> LinenModel:
  return LinenModel(LoopBetweenLayers(), jax.ShapeDtypeStruct((2, 4), jnp.float32))


class TwoLoops(nn.Module):
  """Two loops of `Dense`: Linen numbers the second loop's after the first's,
  which no template follows."""

  widths: tuple[int, ...] = (6, 6)
  depths: tuple[int, ...] = (5,)

  @nn.compact
  def __call__(self, x):
    for width in self.widths:
      x = nn.relu(nn.Dense(width)(x))
    for depth in self.depths:
      x = nn.tanh(nn.Dense(depth)(x))
    return x


def two_loops() -> LinenModel:
  return LinenModel(TwoLoops(), jax.ShapeDtypeStruct((2, 4), jnp.float32))


class NormKind(enum.Enum):
  LAYER = 'layer'
  RMS = 'rms'


class SwitchedByStrings(nn.Module):
  """Code picked by a string and an enum field: every value the source
  names is a branch to trace, write and prove."""

  features: int = 6
  activation: str = 'relu'
  norm: NormKind = NormKind.LAYER

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.features)(x)
    if self.norm == NormKind.RMS:
      x = nn.RMSNorm()(x)
    else:
      x = nn.LayerNorm()(x)
    if self.activation in ('tanh', 'scaled_tanh'):
      x = jnp.tanh(x) * (2.0 if self.activation == 'scaled_tanh' else 1.0)
    else:
      x = {'relu': nn.relu, 'gelu': nn.gelu}[self.activation](x)
    return nn.Dense(3)(x)


def switched_by_strings() -> LinenModel:
  return LinenModel(SwitchedByStrings(), jax.ShapeDtypeStruct((2, 4), jnp.float32))


class InitializedInPlace(nn.Module):
  """An initializer written as a lambda, sizes unpacked from the input's
  shape and one of them read only by a parameter's shape: what the port
  writes of them must pass its own lint (no lambda called where it is
  written, no name unpacked and never read)."""

  features: int = 6

  @nn.compact
  def __call__(self, x):
    _, _, width = x.shape
    scale = self.param('scale', nn.initializers.ones, (width,))
    w = self.param('w', lambda key, shape: jax.random.normal(key, shape) * 0.02, (width, self.features))
    b = self.param('b', lambda key, shape: jnp.zeros(shape), (self.features,))
    offset = self.param('offset', lambda key, shape, v: -v * jnp.ones(shape), (self.features,), self.features - 2.0)
    return (x * scale) @ w + b + offset


def initialized_in_place() -> LinenModel:
  return LinenModel(InitializedInPlace(), jax.ShapeDtypeStruct((2, 3, 5), jnp.float32))


class SowsALoss(nn.Module):
  """An auxiliary loss sown into a collection of its own, and an intermediate."""

  features: int = 6

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.features)(x)
    self.sow('losses', 'activity', jnp.mean(h ** 2))
    self.sow('intermediates', 'hidden', h)
    return nn.Dense(2)(nn.relu(h))


def sows_a_loss() -> LinenModel:
  return LinenModel(SowsALoss(), jax.ShapeDtypeStruct((4, 3), jnp.float32))


class Patchify(nn.Module):
  """A stem whose patch size lives in a namespace, as vit_jax's
  `patches.size`: the Dense after it takes the count of patches."""

  patches: types.SimpleNamespace
  hidden: int = 8

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(self.hidden, self.patches.size, strides=self.patches.size, padding='VALID')(x)
    return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def patchify() -> LinenModel:
  return LinenModel(Patchify(types.SimpleNamespace(size=(4, 4))), jnp.ones((2, 16, 16, 3)))


class FlaggedHead(nn.Module):
  """A layer a flag switches on, whose width a field left None in the
  instance without it gives: the field is not what switches it."""

  hidden: int
  rep: int | None = None
  pre: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.hidden)(x)
    if self.pre:
      x = nn.Dense(self.rep if self.rep is not None else 7)(x)
    return nn.Dense(3)(x)


class TwoFlaggedHeads(nn.Module):
  @nn.compact
  def __call__(self, x):
    return FlaggedHead(8, None, False)(x) + FlaggedHead(8, 5, True)(x)


def two_flagged_heads() -> LinenModel:
  return LinenModel(TwoFlaggedHeads(), jnp.ones((2, 5)))


class WidenedOverALoop(nn.Module):
  """A width read from the input (`nn.Dense(x.shape[-1])`) that each
  iteration of a loop doubles: one site, two sizes."""

  @nn.compact
  def __call__(self, x):
    for _ in range(2):
      x = jnp.concatenate([x, x], -1)
      y = nn.Dense(x.shape[-1])(x[..., :4])
    return y


def widened_over_a_loop() -> LinenModel:
  return LinenModel(WidenedOverALoop(), jnp.ones((2, 4)))


class ResidualDenoiser(nn.Module):
  """DnCNN's shape (scico): the output is `x - y`, y of `channels`
  features, which ties the input's channels to that field."""

  channels: int = 1
  features: int = 4
  depth: int = 3

  @nn.compact
  def __call__(self, x):
    y = nn.relu(nn.Conv(self.features, (3, 3))(x))
    for _ in range(self.depth - 2):
      y = nn.relu(nn.Conv(self.features, (3, 3))(y))
    return x - nn.Conv(self.channels, (3, 3))(y)


def residual_denoiser() -> LinenModel:
  return LinenModel(ResidualDenoiser(), jnp.ones((2, 8, 8, 1)))


class LoRA(nn.Module):
  """A dense layer keeping its kernel and bias in the module's own scope
  (`nn.share_scope`) beside the low-rank factors the module adds."""

  rank: int = 2
  features: int = 6

  @nn.compact
  def __call__(self, x):
    dense = nn.Dense(self.features)
    nn.share_scope(self, dense)
    a = self.param('A', nn.initializers.normal(), (x.shape[-1], self.rank))
    b = self.param('B', nn.initializers.normal(), (self.rank, self.features))
    return dense(x) + x @ a @ b


class LoRAModel(nn.Module):
  @nn.compact
  def __call__(self, x):
    return LoRA(name='lora')(nn.Dense(5)(x))


def lora() -> LinenModel:
  return LinenModel(LoRAModel(), jnp.linspace(-1.0, 1.0, 12).reshape(3, 4))


class NamedScale(nn.Module):
  weight_name: str

  @nn.compact
  def __call__(self, x):
    return x * self.param(self.weight_name, nn.initializers.ones, (x.shape[-1],))


class SharedInALoop(nn.Module):
  """Modules made in a loop, each sharing the class's scope: one attribute
  per local would be wrong, a list is not what Linen's paths say."""

  @nn.compact
  def __call__(self, x):
    for i in range(2):
      scale = NamedScale(f'scale_{i}')
      nn.share_scope(self, scale)
      x = scale(x)
    return x


def shared_in_a_loop() -> LinenModel:
  return LinenModel(SharedInALoop(), jnp.ones((2, 3)))


#: A module constant no configuration changes: the branch it guards is never traced.
REMAT_BLOCKS = False


class MaybeRematted(nn.Module):
  @nn.compact
  def __call__(self, x):
    if REMAT_BLOCKS:
      block = nn.remat(Residual, prevent_cse=False)
      x = block(4)(x)
    else:
      x = Residual(4)(x)
    return nn.Dense(2)(x)


def maybe_rematted() -> LinenModel:
  return LinenModel(MaybeRematted(), jnp.ones((2, 3)))


class TokenPool(nn.Module):
  """A class token only `pool='tok'` makes, its width the input's."""

  pool: str = 'gap'

  @nn.compact
  def __call__(self, x):
    if self.pool == 'tok':
      cls = self.param('cls', nn.initializers.normal(), (1, 1, x.shape[-1]))
      x = jnp.concatenate([jnp.tile(cls, [x.shape[0], 1, 1]), x], axis=1)
    if REMAT_BLOCKS:  # never traced: its variable too
      x = x * self.param('scale', nn.initializers.ones, (x.shape[-1],))
    return nn.Dense(3)(x.mean(axis=1))


class TwoPools(nn.Module):
  @nn.compact
  def __call__(self, x):
    return TokenPool()(x) + TokenPool('tok')(x)


def two_pools() -> LinenModel:
  return LinenModel(TwoPools(), jnp.linspace(-1.0, 1.0, 24).reshape(2, 3, 4))


class SpreadMutated(nn.Module):
  """A spread dict changed after it is bound: its keywords are not the
  ones it was bound with."""

  @nn.compact
  def __call__(self, x):
    inits = dict(kernel_init=nn.initializers.zeros)
    inits['bias_init'] = nn.initializers.ones
    return nn.Dense(4, **inits)(x)


def spread_mutated() -> LinenModel:
  return LinenModel(SpreadMutated(), jnp.ones((2, 3)))


class RematChosenInAnExpression(nn.Module):
  """A flag choosing a transform in an expression rather than an `if`: no
  branch to write to raise where the transform is not written, so the class
  is a stub for every configuration, not a guess."""

  remat: bool = False

  @nn.compact
  def __call__(self, x):
    block = nn.remat(Inner) if self.remat else Inner
    return block(3)(x)


def remat_chosen_in_an_expression() -> LinenModel:
  return LinenModel(RematChosenInAnExpression(), jnp.ones((2, 3)))


def positions(module, typ, length, width, name):
  """big_vision's `get_posemb`, short: a table made through the module handed in."""
  if typ == 'learn':
    return module.param(name, nn.initializers.normal(0.02), (1, length, width))
  return jnp.zeros((1, length, width))


class HandedBehindAFlag(nn.Module):
  """The handed function called under a flag the trace leaves off, and
  under a test no configuration takes."""

  width: int = 8
  use_pos: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.width)(x)
    if self.use_pos:
      _, l, c = x.shape
      x = x + positions(self, 'learn', l, c, 'pos')
    if self.width > 64:
      _, l, c = x.shape
      x = x + positions(self, 'learn', l, c, 'wide_pos')
    return x


def handed_behind_a_flag() -> LinenModel:
  return LinenModel(HandedBehindAFlag(), jnp.ones((2, 5, 3)))


def noisy(module, x, scale):
  """A key drawn through the module handed in: NNX draws from its Rngs."""
  return x + scale * jax.random.normal(module.make_rng('noise'), x.shape)


class HandedToAFunction(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(4)(x)
    return noisy(self, x, 0.1)


def handed_to_a_function() -> LinenModel:
  return LinenModel(HandedToAFunction(), jnp.ones((2, 3, 5)))


class UntracedElse(nn.Module):
  """An `if` on a size whose else no configuration traced or proven takes."""

  width: int = 8

  @nn.compact
  def __call__(self, x):
    if self.width <= 64:
      x = nn.Dense(self.width)(x)
    else:
      x = nn.Dense(64)(nn.relu(nn.Dense(self.width)(x)))
    return x


def untraced_else() -> LinenModel:
  return LinenModel(UntracedElse(), jnp.ones((2, 5)))


class TwoRefusedFlags(nn.Module):
  """Two flags each taking a branch the port cannot write (`nn.vmap` of a
  module), one nested in the other's else, and a flag it can."""

  per_example: bool = False
  batched: bool = False
  extra: bool = False

  @nn.compact
  def __call__(self, x):
    if self.per_example:
      x = nn.vmap(Inner, variable_axes={'params': None}, split_rngs={'params': False})(3, name='inner')(x)
    else:
      if self.batched:
        x = nn.vmap(Inner, variable_axes={'params': 0}, split_rngs={'params': True})(3, name='inner')(x)
      else:
        x = Inner(3, name='inner')(x)
    if self.extra:
      x = nn.Dense(2, name='extra')(x)
    return x


def two_refused_flags() -> LinenModel:
  return LinenModel(TwoRefusedFlags(), jnp.ones((2, 5)))


class ChosenByTheCall(nn.Module):
  """Arguments chosen by a flag of the call: NNX builds the layer before
  any call."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    kw = {'kernel_init': nn.initializers.zeros} if train else {}
    return nn.Dense(4, **kw)(x)


def chosen_by_the_call() -> LinenModel:
  return LinenModel(ChosenByTheCall(), jnp.ones((2, 3)))


class ChosenLinenOnlyArgument(nn.Module):
  """A chosen argument nnx.Linear does not take."""

  plain: bool = True

  @nn.compact
  def __call__(self, x):
    return nn.Dense(4, **({} if self.plain else {'dot_general_cls': None}))(x)


def chosen_linen_only_argument() -> LinenModel:
  return LinenModel(ChosenLinenOnlyArgument(), jnp.ones((2, 3)))


@dataclasses.dataclass(frozen=True)
class DropConfig:
  deterministic: bool = True
  rate: float = 0.1


class ModeThroughALocal(nn.Module):
  """setup()'s layers given their mode by the configuration, which the
  call reads through a local for more than modes."""

  config: DropConfig

  def setup(self):
    self.dense = nn.Dense(3)
    self.drop = nn.Dropout(self.config.rate, deterministic=self.config.deterministic)

  def __call__(self, x):
    cfg = self.config
    y = self.drop(self.dense(x))
    if not cfg.deterministic:
      y = y * 2.0
    return y


def mode_through_a_local() -> LinenModel:
  return LinenModel(ModeThroughALocal(DropConfig()), jnp.ones((2, 3)))


class OneListTwoLayers(nn.Module):
  def setup(self):
    self.layers = [nn.Dense(4), nn.Dense(4)]

  def __call__(self, x):
    for layer in self.layers:
      x = nn.relu(layer(x))
    return x


def one_list_two_layers() -> LinenModel:
  return LinenModel(OneListTwoLayers(), jnp.ones((2, 4)))


class NamedCounter(nn.Module):
  """A statistic named by a field (`self.variable(..., self.stat_name, ...)`)."""

  stat_name: str = 'count'

  @nn.compact
  def __call__(self, x):
    v = self.variable('batch_stats', self.stat_name, jnp.ones, (x.shape[-1],))
    return nn.Dense(3)(x * v.value)


class NamedCounters(nn.Module):
  @nn.compact
  def __call__(self, x):
    return NamedCounter(stat_name='a')(x) + NamedCounter(stat_name='b')(x)


def named_counters() -> LinenModel:
  return LinenModel(NamedCounters(), jnp.linspace(-1.0, 1.0, 6).reshape(2, 3))


class EmbeddingUser(nn.Module):
  emb: nn.Module

  @nn.compact
  def __call__(self, tokens):
    return nn.Dense(3, name='out')(self.emb(tokens))


class HandsOnItsEmbedding(nn.Module):
  """A module it was handed, handed on to the module that uses it."""

  emb: nn.Module

  @nn.compact
  def __call__(self, tokens):
    return EmbeddingUser(emb=self.emb, name='user')(tokens)


class EmbeddingMadeInPlace(nn.Module):
  """An embedding made in place as the argument of the module using it."""

  vocab: int = 11
  width: int = 4

  @nn.compact
  def __call__(self, tokens):
    return EmbeddingUser(emb=nn.Embed(self.vocab, self.width))(tokens)


class EmbeddingNamedByALocal(nn.Module):
  vocab: int = 11
  width: int = 4

  @nn.compact
  def __call__(self, tokens):
    emb = nn.Embed(self.vocab, self.width)
    return EmbeddingUser(emb=emb)(tokens)


class EmbeddingHandedOnTwice(nn.Module):
  """An embedding handed through a module that only hands it on."""

  vocab: int = 11
  width: int = 4

  def setup(self):
    self.table = nn.Embed(self.vocab, self.width)
    self.outer = HandsOnItsEmbedding(emb=self.table)

  def __call__(self, tokens):
    return self.outer(tokens)


def embedding_made_in_place() -> LinenModel:
  return LinenModel(EmbeddingMadeInPlace(), jnp.arange(6).reshape(2, 3) % 11)


def embedding_named_by_a_local() -> LinenModel:
  return LinenModel(EmbeddingNamedByALocal(), jnp.arange(6).reshape(2, 3) % 11)


def embedding_handed_on_twice() -> LinenModel:
  return LinenModel(EmbeddingHandedOnTwice(), jnp.arange(6).reshape(2, 3) % 11)


class PositionsOfTheInputsDtype(nn.Module):
  """Position embeddings made in the dtype of the inputs (scenic's
  `AddPositionEmbs`), and a probe in that of a value of the call."""

  @nn.compact
  def __call__(self, inputs):
    pe = self.param('pos_embedding', nn.initializers.normal(0.02), (1, inputs.shape[1], inputs.shape[2]),
                    inputs.dtype)
    x = nn.Dense(4)(inputs + pe)
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, x.shape[-1]), x.dtype)
    return x * probe


def positions_of_the_inputs_dtype() -> LinenModel:
  return LinenModel(PositionsOfTheInputsDtype(), jnp.linspace(-1.0, 1.0, 30).reshape(2, 5, 3))


class SharedEmbedding(nn.Module):
  """A shared layer whose variable Linen makes in its `setup()` (nn.Embed)."""

  vocab: int = 10

  @nn.compact
  def __call__(self, tokens):
    emb = nn.Embed(self.vocab, 4)
    nn.share_scope(self, emb)
    return emb(tokens)


class HoldsASharedEmbedding(nn.Module):
  vocab: int = 10

  @nn.compact
  def __call__(self, tokens):
    return nn.Dense(3)(SharedEmbedding(self.vocab, name='p')(tokens))


def shared_embedding() -> LinenModel:
  return LinenModel(HoldsASharedEmbedding(), jnp.array([[1, 2, 3], [4, 5, 6]]))


class SharedUnderACondition(nn.Module):
  share: bool = True

  @nn.compact
  def __call__(self, x):
    d = nn.Dense(4)
    if self.share:
      nn.share_scope(self, d)
    return d(x)


def shared_under_a_condition() -> LinenModel:
  return LinenModel(SharedUnderACondition(), jnp.ones((2, 3)))


class SharedAttention(nn.Module):
  @nn.compact
  def __call__(self, x):
    attn = nn.MultiHeadDotProductAttention(num_heads=2)
    nn.share_scope(self, attn)
    return attn(x)


def shared_attention() -> LinenModel:
  return LinenModel(SharedAttention(), jnp.ones((2, 3, 4)))


class NormsNoneTogether(nn.Module):
  """Attributes set to None together before the modules a flag makes."""

  norms: bool = True

  def setup(self):
    self.pre = self.post = None
    self.scale, self.shift = None, None
    if self.norms:
      self.pre = nn.LayerNorm()
      self.post = nn.LayerNorm()
      self.scale = nn.Dense(4)
      self.shift = nn.Dense(4)

  def __call__(self, x):
    if self.pre is not None:
      x = self.post(self.scale(self.pre(x)) + self.shift(x))
    return x


def norms_none_together() -> LinenModel:
  return LinenModel(NormsNoneTogether(), jnp.linspace(-1.0, 1.0, 8).reshape(2, 4))


class ReadsASubmodulesVariables(nn.Module):
  """Linen's Module API read on a submodule in `setup()` (Flax's
  `examples/linen_design_test/mlp_lazy.py` prints `self.dense2.variables`)."""

  def setup(self):
    self.dense = nn.Dense(3)
    self.before_init = len(self.dense.variables)  # 0: not initialised yet

  def __call__(self, x):
    return self.dense(x)


def reads_a_submodules_variables() -> LinenModel:
  return LinenModel(ReadsASubmodulesVariables(), jnp.ones((2, 4)))
