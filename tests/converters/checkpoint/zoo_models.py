"""The model zoo's pairs as a user describes them to the checkpoint tool.

A user module, written as a team porting its models would write it for
`linen-nnx convert --linen-model tests.converters.checkpoint.zoo_models:linen_cnn
--nnx-model ...:nnx_cnn --paths ...:CNN_PATHS --optimizer ...:make_tx`: a
factory per model returning the Linen module with example inputs
(`LinenModel`) or the NNX module, the path mappings (the zoo's hand-written
tables as `PathMapping`s) and the optax transform. The transformer's
factories take `layout=` so that one pair serves scan <-> loop conversions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from converters import LinenModel, PathMapping, PathRule, Rearrange
from model_zoo import paths as zoo_paths
from model_zoo.configs import RULES, CNNConfig, ResNetConfig, RNNConfig, TransformerConfig
from model_zoo.linen import cnn as linen_cnn_module
from model_zoo.linen import resnet as linen_resnet_module
from model_zoo.linen import rnn as linen_rnn_module
from model_zoo.linen import transformer as linen_transformer_module
from model_zoo.nnx import cnn as nnx_cnn_module
from model_zoo.nnx import resnet as nnx_resnet_module
from model_zoo.nnx import rnn as nnx_rnn_module
from model_zoo.nnx import transformer as nnx_transformer_module

LEARNING_RATE = 1e-2


def mapping(table) -> PathMapping:
  """A zoo table as a `PathMapping`: one rule per row, every collection (a row
  with a pattern reshapes, or fuses its parts, by that pattern)."""
  return PathMapping([
      PathRule(
          row.linen, row.nnx, row.linen_stacked, row.nnx_stacked,
          transform=Rearrange(row.pattern, **dict(row.sizes)) if row.pattern else None,
      )
      for rows in table.values() for row in rows
  ])


def make_tx() -> optax.GradientTransformation:
  return optax.adam(LEARNING_RATE)


def make_sgd() -> optax.GradientTransformation:
  """Another optax chain: SGD with momentum and a clipped gradient."""
  return optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(LEARNING_RATE, momentum=0.9))


CNN = CNNConfig()
RESNET = ResNetConfig()
RNN = RNNConfig()
TOKENS = jax.ShapeDtypeStruct((2, 8), jnp.int32)


def images(config) -> jax.ShapeDtypeStruct:
  size = getattr(config, 'image_size', 8)
  return jax.ShapeDtypeStruct((2, size, size, config.in_channels), jnp.float32)


def linen_cnn() -> LinenModel:
  return LinenModel(linen_cnn_module.CNN(CNN), images(CNN), train=False)


def nnx_cnn() -> nnx.Module:
  return nnx_cnn_module.CNN(CNN, rngs=nnx.Rngs(0))


CNN_PATHS = mapping(zoo_paths.CNN)


def linen_resnet() -> LinenModel:
  return LinenModel(linen_resnet_module.ResNet(RESNET), images(RESNET), train=False)


def nnx_resnet() -> nnx.Module:
  return nnx_resnet_module.ResNet(RESNET, rngs=nnx.Rngs(0))


RESNET_PATHS = mapping(zoo_paths.RESNET)


def linen_rnn() -> LinenModel:
  return LinenModel(linen_rnn_module.RNNLM(RNN), TOKENS)


def nnx_rnn() -> nnx.Module:
  """The port to NNX's fused-gate `OptimizedLSTMCell` (its kernels reshaped)."""
  return nnx_rnn_module.RNNLM(RNN, cell='optimized_lstm', rngs=nnx.Rngs(0))


RNN_PATHS = mapping(zoo_paths.RNN_OPTIMIZED_CELL)


def transformer_config(layout: str = 'loop') -> TransformerConfig:
  return TransformerConfig(scan_layers=layout == 'scan')


def linen_transformer(layout: str = 'loop') -> LinenModel:
  return LinenModel(linen_transformer_module.TransformerLM(transformer_config(layout)), TOKENS)


def nnx_transformer(layout: str = 'loop') -> nnx.Module:
  return nnx_transformer_module.TransformerLM(
      transformer_config(layout), idiom='rules_metadata', rngs=nnx.Rngs(0)
  )


TRANSFORMER_PATHS = mapping(zoo_paths.TRANSFORMER)
TRANSFORMER_RULES = RULES
