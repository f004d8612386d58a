"""Configurations of the zoo's models: small by default, `realistic()` for real sizes.

The defaults are small enough to initialise and run in milliseconds on a CPU
(the tests use them); `realistic()` gives the sizes such a model has in
practice. Every configuration is a frozen dataclass checked on construction:
a bad value raises `ValueError` naming the field and how to fix it.
The Linen model and its NNX port read the same configuration.

`RULES` maps the transformer's logical axis names to the mesh axes of a
`('data', 'model')` mesh, as Flax's lm1b and gemma examples do.
"""

from __future__ import annotations

import dataclasses

#: Logical axis name -> mesh axis (None: replicated), in the order the
#: resolver walks them.
RULES: tuple[tuple[str, str | None], ...] = (
    ('batch', 'data'),
    ('vocab', 'model'),
    ('embed', None),
    ('mlp', 'model'),
    ('heads', 'model'),
    ('kv', None),
    ('layers', None),
    ('length', None),
)

NORMS = ('layernorm', 'rmsnorm')


def _positive(config, *fields: str) -> None:
  for field in fields:
    value = getattr(config, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(
          f'{type(config).__name__}.{field} must be a positive int, got {value!r}'
      )


def _rate(config, *fields: str) -> None:
  for field in fields:
    value = getattr(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
      raise ValueError(
          f'{type(config).__name__}.{field} must be in [0, 1) (a dropout rate), got {value!r}'
      )


def _positive_tuple(config, field: str) -> None:
  value = getattr(config, field)
  if (not isinstance(value, tuple) or not value
      or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value)):
    raise ValueError(
        f'{type(config).__name__}.{field} must be a non-empty tuple of positive ints, '
        f'got {value!r}'
    )


@dataclasses.dataclass(frozen=True)
class CNNConfig:
  """A LeNet-like CNN: (conv, relu, avg_pool) per entry of `features`, then two dense layers."""

  image_size: int = 8
  in_channels: int = 1
  features: tuple[int, ...] = (4, 8)
  hidden: int = 16
  num_classes: int = 10
  dropout_rate: float = 0.5

  def __post_init__(self):
    _positive(self, 'image_size', 'in_channels', 'hidden', 'num_classes')
    _positive_tuple(self, 'features')
    _rate(self, 'dropout_rate')
    if self.image_size < 2 ** len(self.features):
      raise ValueError(
          f'CNNConfig.image_size={self.image_size} is halved {len(self.features)} times '
          f'(one avg_pool per entry of features): make it at least '
          f'{2 ** len(self.features)} or use fewer features'
      )

  @property
  def flat_features(self) -> int:
    """The width of the flattened feature map that enters the first dense layer."""
    size = self.image_size // 2 ** len(self.features)
    return size * size * self.features[-1]

  @classmethod
  def realistic(cls) -> CNNConfig:
    """The MNIST classifier of Flax's examples."""
    return cls(image_size=28, in_channels=1, features=(32, 64), hidden=256, num_classes=10)


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
  """A CIFAR-style ResNet: 3x3 stem, stages of basic residual blocks, mean pool, dense head.

  Stage `i` has `stage_sizes[i]` blocks of `num_filters * 2**i` filters; the
  first block of every stage but the first halves the resolution.
  """

  in_channels: int = 3
  stage_sizes: tuple[int, ...] = (1, 1)
  num_filters: int = 8
  num_classes: int = 10
  momentum: float = 0.9
  epsilon: float = 1e-5

  def __post_init__(self):
    _positive(self, 'in_channels', 'num_filters', 'num_classes')
    _positive_tuple(self, 'stage_sizes')
    if not 0.0 <= self.momentum < 1.0:
      raise ValueError(
          f'ResNetConfig.momentum must be in [0, 1) (the running averages keep this '
          f'fraction per step), got {self.momentum!r}'
      )
    if not self.epsilon > 0:
      raise ValueError(f'ResNetConfig.epsilon must be > 0, got {self.epsilon!r}')

  @property
  def num_blocks(self) -> int:
    return sum(self.stage_sizes)

  @classmethod
  def realistic(cls) -> ResNetConfig:
    """ResNet-18 for 32x32 images."""
    return cls(stage_sizes=(2, 2, 2, 2), num_filters=64)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """A decoder-only pre-norm transformer LM with tied input and output embeddings.

  `scan_layers` stacks the blocks and runs them with a (rematerialised) scan
  instead of a Python loop; the parameters are the same, stacked on a leading
  `layers` axis.
  """

  vocab_size: int = 64
  width: int = 32
  num_heads: int = 4
  mlp_dim: int = 64
  num_layers: int = 2
  max_len: int = 16
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  norm: str = 'layernorm'
  scan_layers: bool = False

  def __post_init__(self):
    _positive(self, 'vocab_size', 'width', 'num_heads', 'mlp_dim', 'num_layers', 'max_len')
    _rate(self, 'dropout_rate', 'attention_dropout_rate')
    if self.width % self.num_heads:
      divisors = [d for d in range(1, self.width + 1) if self.width % d == 0]
      raise ValueError(
          f'TransformerConfig.num_heads={self.num_heads} must divide width={self.width}: '
          f'choose num_heads in {divisors} or change width'
      )
    if self.norm not in NORMS:
      raise ValueError(f'TransformerConfig.norm must be one of {NORMS}, got {self.norm!r}')
    if not isinstance(self.scan_layers, bool):
      raise ValueError(
          f'TransformerConfig.scan_layers must be a bool, got {self.scan_layers!r}'
      )

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  @classmethod
  def realistic(cls) -> TransformerConfig:
    """12 blocks of width 512 (GPT-2-small-like depth), scanned."""
    return cls(
        vocab_size=32_000, width=512, num_heads=8, mlp_dim=2048, num_layers=12,
        max_len=1024, norm='rmsnorm', scan_layers=True,
    )


@dataclasses.dataclass(frozen=True)
class RNNConfig:
  """An LSTM language model: embedding, one LSTM layer, dense logits."""

  vocab_size: int = 32
  embed_dim: int = 16
  hidden: int = 24

  def __post_init__(self):
    _positive(self, 'vocab_size', 'embed_dim', 'hidden')

  @classmethod
  def realistic(cls) -> RNNConfig:
    """A word-level LSTM LM of the size of classic Penn Treebank models."""
    return cls(vocab_size=10_000, embed_dim=650, hidden=650)
