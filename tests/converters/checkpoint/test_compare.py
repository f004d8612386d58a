"""Tests of `converters.checkpoint.compare`: the path correspondence of its rows."""

from __future__ import annotations

import pytest

from converters.checkpoint.compare import nnx_path_of
from linen_nnx_cli.kit_models import correspondence_of_name
from converters.presets import KIT_PATHS


@pytest.mark.parametrize('linen_path, optimizer, nnx_path', [
    (('step',), 'adam', 'optimizer/step'),
    (('params', 'DotReluDot_1', 'W2', 'value'), 'adam', 'model/layers/1/w2'),
    (('params', 'ScanDotReluDot_0', 'Dense_0', 'kernel'), 'adam', 'model/layers/dot1/kernel'),
    (('opt_state', '0', 'mu', 'DotReluDot_0', 'Dense_0', 'kernel', 'value'), 'adamw',
     'optimizer/opt_state/0/mu/layers/0/dot1/kernel'),
    (('opt_state', '0', 'count'), 'adam', 'optimizer/opt_state/0/count'),
    (('opt_state', '0', 'trace', 'ScanDotReluDot_0', 'W2'), 'sgd_momentum',
     'optimizer/opt_state/0/trace/layers/w2'),
    (('opt_state', '0', 'ema', 'DotReluDot_0', 'W2', 'value'), 'fsdp_sgd',
     'optimizer/momentum/layers/0/w2'),
    (('opt_state', '0', 'count'), 'fsdp_sgd', '(optimizer/step)'),
    (('params', 'Embed_0', 'embedding'), 'adam', '?'),
])
def test_nnx_path_of_follows_the_converters_correspondence(linen_path, optimizer, nnx_path):
  assert nnx_path_of(linen_path, KIT_PATHS, correspondence_of_name(optimizer)) == nnx_path
