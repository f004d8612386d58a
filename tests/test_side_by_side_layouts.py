"""Linen and NNX creations of one description shard every parameter alike.

The parameter correspondence is written out in `tests.helpers`, independently
of `converters.paths`, and checked against `KIT_PATHS` too.
"""

from __future__ import annotations

import jax
import pytest
from flax import linen as nn
from flax import nnx

from converters.paths import format_path
from converters.presets import KIT_PATHS
from tests.helpers import MATRIX, matrix_id, parameter_pairs
from tests.linen_impl.test_train import run as run_linen
from tests.nnx_impl.test_train import run as run_nnx


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_linen_and_nnx_give_the_same_partition_specs(case):
  linen, nnx_run = run_linen(case), run_nnx(case)
  desc = linen['desc']
  pairs = parameter_pairs(desc)
  linen_state = {'params': linen['initial'].params}
  linen_specs = {'params': linen['trainer'].sharding.params}
  nnx_params = nnx_run['trainer'].to_state(nnx_run['initial'])
  nnx_specs = nnx.get_partition_spec(nnx_params)
  # The correspondence covers every parameter on both sides.
  assert len(pairs) == len(nnx.to_flat_state(nnx.filter_state(nnx_params, nnx.Param)))
  linen_boxes = jax.tree.leaves(
      linen_state, is_leaf=lambda x: isinstance(x, nn.Partitioned)
  )
  assert len(pairs) == len(linen_boxes)
  for linen_path, nnx_path in pairs:
    (match,) = KIT_PATHS.match_all('linen', linen_path[1:])
    assert ('model',) + match.rule.path('nnx', match.layout, match.index) == nnx_path
    where = f'{format_path(linen_path)} <-> {format_path(nnx_path)}'
    box = _get(linen_state, linen_path)
    var = _get(nnx_params, nnx_path)
    assert box.names == var.get_metadata()['out_sharding'], where
    assert box.value.shape == var[...].shape, where
    assert _get(linen_specs, linen_path).spec == _get(nnx_specs, nnx_path).get_value(), where
    # Actual shardings may differ in trailing Nones only (P('model', None) on
    # Linen's jit outputs, P('model',) on NNX's): compare them as shardings.
    ndim = box.value.ndim
    assert box.value.sharding.is_equivalent_to(var[...].sharding, ndim), where
