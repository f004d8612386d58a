"""Hypothesis strategies over the model zoo's configurations, meshes and logical rule sets.

Small sizes, for CPU tests: the properties that convert zoo ports
(`tests/converters/test_zoo_ports.py`) draw from them. Every drawn
configuration is valid (the zoo's configs check themselves when made), and
every drawn mesh and rule set shards the drawn transformer evenly.
"""

from __future__ import annotations

from hypothesis import strategies as st

from model_zoo.configs import RULES, CNNConfig, ResNetConfig, RNNConfig, TransformerConfig

#: (data, model) shapes of the 8 simulated devices.
MESH_SHAPES = ((2, 4), (4, 2), (1, 8), (8, 1))

#: Rule sets for the transformer's logical names: the zoo's (`RULES`), all
#: replicated, and the vocabulary and MLP sharded over the other mesh axis.
RULE_SETS = {
    'zoo': RULES,
    'replicated': tuple((name, None) for name, _ in RULES),
    'over data': tuple(
        (name, 'data' if axis == 'model' else ('model' if axis == 'data' else None)) for name, axis in RULES
    ),
}


@st.composite
def cnn_configs(draw) -> CNNConfig:
  features = tuple(draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=2)))
  return CNNConfig(
      image_size=draw(st.sampled_from([2 ** len(features), 8])),
      in_channels=draw(st.integers(1, 3)),
      features=features,
      hidden=draw(st.sampled_from([4, 16])),
      num_classes=draw(st.integers(2, 10)),
  )


@st.composite
def resnet_configs(draw) -> ResNetConfig:
  return ResNetConfig(
      stage_sizes=tuple(draw(st.lists(st.integers(1, 2), min_size=1, max_size=2))),
      num_filters=draw(st.sampled_from([4, 8])),
  )


@st.composite
def rnn_configs(draw) -> RNNConfig:
  return RNNConfig(
      vocab_size=draw(st.sampled_from([8, 32])),
      embed_dim=draw(st.sampled_from([4, 16])),
      hidden=draw(st.sampled_from([4, 8, 24])),
  )


@st.composite
def transformer_configs(draw, multiple: int = 1) -> TransformerConfig:
  """Transformer configurations whose sharded sizes (width, vocabulary, MLP)
  are multiples of `multiple` (the largest mesh axis they may be sharded over)."""
  heads = draw(st.sampled_from([1, 2, 4]))
  return TransformerConfig(
      vocab_size=multiple * draw(st.sampled_from([8, 16])),
      width=heads * multiple * draw(st.sampled_from([4, 8])),
      num_heads=heads,
      mlp_dim=multiple * draw(st.sampled_from([8, 16])),
      num_layers=draw(st.integers(1, 3)),
      max_len=8,
      norm=draw(st.sampled_from(['layernorm', 'rmsnorm'])),
      scan_layers=draw(st.booleans()),
  )
