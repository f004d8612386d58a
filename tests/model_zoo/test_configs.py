"""`model_zoo.configs`: small defaults, realistic sizes, and errors that say how to fix them."""

from __future__ import annotations

import dataclasses

import pytest

from model_zoo import configs
from model_zoo.configs import CNNConfig, ResNetConfig, RNNConfig, TransformerConfig

ALL = (CNNConfig, ResNetConfig, TransformerConfig, RNNConfig)


@pytest.mark.parametrize('cls', ALL, ids=lambda c: c.__name__)
def test_defaults_and_realistic_sizes_are_valid_frozen_configs(cls):
  small, real = cls(), cls.realistic()
  assert isinstance(real, cls) and small != real
  with pytest.raises(dataclasses.FrozenInstanceError):
    small.__setattr__(dataclasses.fields(cls)[0].name, 3)


def test_realistic_transformer_is_twelve_blocks_of_width_512():
  config = TransformerConfig.realistic()
  assert (config.num_layers, config.width, config.head_dim) == (12, 512, 64)
  assert config.scan_layers


def test_realistic_resnet_is_resnet18():
  assert ResNetConfig.realistic().stage_sizes == (2, 2, 2, 2)
  assert ResNetConfig.realistic().num_blocks == 8


def test_cnn_flat_features():
  assert CNNConfig(image_size=28, features=(32, 64)).flat_features == 7 * 7 * 64
  assert CNNConfig(image_size=9, features=(4,)).flat_features == 4 * 4 * 4


@pytest.mark.parametrize(
    'make, match',
    [
        (lambda: TransformerConfig(width=32, num_heads=5),
         r'num_heads=5 must divide width=32: choose num_heads in \[1, 2, 4, 8, 16, 32\]'),
        (lambda: TransformerConfig(norm='batchnorm'), r'norm must be one of'),
        (lambda: TransformerConfig(dropout_rate=1.0), r'TransformerConfig\.dropout_rate must be in \[0, 1\)'),
        (lambda: TransformerConfig(attention_dropout_rate=-0.1), r'attention_dropout_rate'),
        (lambda: TransformerConfig(num_layers=0), r'TransformerConfig\.num_layers must be a positive int'),
        (lambda: TransformerConfig(scan_layers='yes'), r'scan_layers must be a bool'),
        (lambda: CNNConfig(features=()), r'CNNConfig\.features must be a non-empty tuple'),
        (lambda: CNNConfig(features=[4, 8]), r'CNNConfig\.features must be a non-empty tuple'),
        (lambda: CNNConfig(image_size=4, features=(4, 4, 4)),
         r'CNNConfig\.image_size=4 is halved 3 times .* at least 8'),
        (lambda: ResNetConfig(stage_sizes=(1, 0)), r'ResNetConfig\.stage_sizes'),
        (lambda: ResNetConfig(momentum=1.0), r'ResNetConfig\.momentum must be in \[0, 1\)'),
        (lambda: ResNetConfig(epsilon=0.0), r'ResNetConfig\.epsilon must be > 0'),
        (lambda: RNNConfig(hidden=2.5), r'RNNConfig\.hidden must be a positive int'),
        (lambda: RNNConfig(vocab_size=True), r'RNNConfig\.vocab_size must be a positive int'),
    ],
)
def test_bad_values_raise_naming_the_field_and_the_fix(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_rules_name_every_logical_axis_once():
  names = [name for name, _ in configs.RULES]
  assert len(names) == len(set(names))
  assert set(names) == {'batch', 'vocab', 'embed', 'mlp', 'heads', 'kv', 'layers', 'length'}
