"""Tests of `converters.checkpoint.compare`: path correspondence and bit-level comparison."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from converters.checkpoint.compare import bits_equal, leaf_difference, nnx_path_of
from converters.checkpoint.kit import correspondence_of_name
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


def _sharded(x, spec):
  mesh = jax.make_mesh((2, 4), ('data', 'model'))
  return jax.device_put(x, NamedSharding(mesh, spec))


def test_bits_equal_compares_bits_shard_by_shard_and_across_shardings():
  x = jnp.arange(32.0).reshape(4, 8).at[0, 0].set(jnp.nan)
  a = _sharded(x, P('data', 'model'))
  assert bits_equal([a], [_sharded(x, P('data', 'model'))]) == [True]  # NaN == NaN by bits
  assert bits_equal([a], [_sharded(x, P(None, 'model'))]) == [True]  # on device
  assert bits_equal([a], [_sharded(x.at[3, 7].add(1.0), P('data', 'model'))]) == [False]
  assert bits_equal([_sharded(jnp.zeros(8), P())], [_sharded(-jnp.zeros(8), P())]) == [False]
  assert bits_equal([a], [_sharded(x.astype(jnp.bfloat16), P('data', 'model'))]) == [False]


def test_bits_equal_refuses_lists_of_different_lengths():
  a = _sharded(jnp.zeros(8), P())
  with pytest.raises(ValueError, match='1 arrays against 2; compare the leaves of trees of one structure'):
    bits_equal([a], [a, a])  # zip would drop the second and call them equal


def test_leaf_difference_reports_the_largest_absolute_difference():
  x = jnp.arange(8.0)
  same, diff = leaf_difference(x, x.at[5].add(0.25))
  assert not same and diff == pytest.approx(0.25)
  assert leaf_difference(x, x) == (True, 0.0)
  assert np.isnan(leaf_difference(x, x[:4])[1])
