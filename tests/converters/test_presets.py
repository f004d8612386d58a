"""Tests of `converters.presets`: the published models' mappings, and the deprecated former default."""

from __future__ import annotations

import warnings

import jax
import pytest

import converters
from converters.errors import PathMappingError
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




def test_an_omitted_mapping_of_a_tree_the_former_default_maps_is_that_default_with_a_warning():
  variables = {'params': linen_trained(description('device', False), 'adam', 0).params}
  with pytest.warns(DeprecationWarning, match='paths=converters.GUIDE_PATHS'):
    implicit = converters.linen_to_nnx(variables)
  explicit = converters.linen_to_nnx(variables, paths=GUIDE_PATHS)
  assert jax.tree.structure(implicit) == jax.tree.structure(explicit)
  assert all(a is b for a, b in zip(jax.tree.leaves(implicit), jax.tree.leaves(explicit)))


def test_a_tree_the_former_default_maps_in_part_fails_as_it_did():
  params = dict(linen_trained(description('device', False), 'adam', 0).params)
  params['head'] = {'kernel': params['DotReluDot_0']['W2']}
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    with pytest.raises(PathMappingError, match='head/kernel'):
      converters.linen_to_nnx({'params': params})


@pytest.mark.parametrize('name', ['GUIDE_PATHS', 'GUIDE_LOGICAL_PATHS', 'KIT_PATHS'])
def test_presets_imported_from_their_old_module_still_work_with_a_warning(name):
  import converters.paths
  import converters.presets

  with pytest.warns(DeprecationWarning, match=f'converters.presets.{name}'):
    assert getattr(converters.paths, name) is getattr(converters.presets, name)
