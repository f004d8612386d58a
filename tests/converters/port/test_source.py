"""`converters.port.source`: how a Linen class's name becomes an attribute's."""

from __future__ import annotations

import pytest

from converters.port.source import snake_case


@pytest.mark.parametrize('name, snake', [
    ('Dense_0', 'dense_0'),
    ('MultiHeadDotProductAttention', 'multi_head_dot_product_attention'),
    ('ResNetBlock', 'res_net_block'),
    # An acronym is one word.
    ('LSTMCell', 'lstm_cell'),
    ('OptimizedLSTMCell', 'optimized_lstm_cell'),
    ('ConvBNBlock', 'conv_bn_block'),
    ('DnCNNNet', 'dn_cnn_net'),
    ('RMSNorm', 'rms_norm'),
    ('MLP', 'mlp'),
    # One capital closing a word belongs to it (ViT, DiT), as a digit's suffix does.
    ('ViTBlock', 'vit_block'),
    ('DiTBlock', 'dit_block'),
    ('ViT', 'vit'),
    ('Conv2D', 'conv2d'),
    ('Encoder1DBlock', 'encoder1d_block'),
])
def test_class_names_become_the_attribute_names_a_person_writes(name, snake):
  assert snake_case(name) == snake
