"""Tests of `converters.presets`: the published models' mappings, which a conversion uses only when given."""

from __future__ import annotations

import jax
import pytest

import converters
from converters.presets import GUIDE_LOGICAL_PATHS, GUIDE_PATHS, KIT_PATHS
from tests.converters.conversion_cases import description, linen_trained

@pytest.mark.parametrize(
    'linen, nnx, layout, index',
    [
        (('DotReluDot_0', 'Dense_0', 'kernel'), ('layers', 0, 'dot1', 'kernel'), 'loop', 0),
        (('DotReluDot_12', 'W2'), ('layers', 12, 'w2'), 'loop', 12),
        (('ScanDotReluDot_0', 'Dense_0', 'kernel'), ('layers', 'dot1', 'kernel'), 'scan', None),
        (('ScanDotReluDot_0', 'W2'), ('layers', 'w2'), 'scan', None),
    ],
)
def test_guide_paths_map_both_ways(linen, nnx, layout, index):
  (linen_match,) = GUIDE_PATHS.match_all('linen', linen)
  (nnx_match,) = GUIDE_PATHS.match_all('nnx', nnx)
  assert linen_match == nnx_match
  assert (linen_match.layout, linen_match.index) == (layout, index)
  assert linen_match.rule.path('nnx', layout, index) == nnx
  assert nnx_match.rule.path('linen', layout, index) == linen


def test_kit_paths_are_the_guide_paths_and_logical_guide_names_differ():
  assert KIT_PATHS is GUIDE_PATHS
  (m,) = GUIDE_LOGICAL_PATHS.match_all('linen', ('LogicalDotReluDot_1', 'W2'))
  assert m.rule.path('nnx', 'loop', 1) == ('layers', 1, 'w2')
  assert GUIDE_LOGICAL_PATHS.match_all('linen', ('ScanLogicalDotReluDot_0', 'W2'))
  assert not GUIDE_PATHS.match_all('linen', ('LogicalDotReluDot_1', 'W2'))


def test_an_omitted_mapping_keeps_the_guide_models_paths(recwarn):
  variables = {'params': linen_trained(description('device', False), 'adam', 0).params}
  kept = converters.linen_to_nnx(variables)
  mapped = converters.linen_to_nnx(variables, paths=GUIDE_PATHS)
  assert set(kept) == set(variables['params']) and all(k.startswith('DotReluDot_') for k in kept)
  assert set(mapped) == {'layers'}
  assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
