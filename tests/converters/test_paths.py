"""Tests of `converters.paths` and `converters.presets`: rules, presets and what they reject."""

from __future__ import annotations

import pytest

from converters.errors import PathMappingError
from converters.paths import PathMapping, PathRule
from converters.presets import GUIDE_LOGICAL_PATHS, GUIDE_PATHS, KIT_PATHS


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


def test_leading_zeros_are_not_layer_indices():
  assert not KIT_PATHS.match_all('linen', ('DotReluDot_01', 'W2'))


def test_user_rules_extend_a_preset():
  mapping = KIT_PATHS + [PathRule('Embed_0/embedding', 'embed/embedding')]
  (m,) = mapping.match_all('linen', ('Embed_0', 'embedding'))
  assert (m.layout, m.rule.path('nnx', m.layout, None)) == ('plain', ('embed', 'embedding'))


def test_match_lists_every_unmapped_and_ambiguous_path():
  mapping = KIT_PATHS + [PathRule('DotReluDot_3/W2', 'special/w2')]
  paths = [('DotReluDot_3', 'W2'), ('Head_0', 'kernel'), ('Head_0', 'bias'), ('DotReluDot_0', 'W2')]
  with pytest.raises(PathMappingError) as info:
    mapping.match('linen', paths)
  assert set(info.value.paths) == {
      'Head_0/kernel', 'Head_0/bias',
      "DotReluDot_3/W2 (rules: 'DotReluDot_{i}/W2'; 'DotReluDot_3/W2')",
  }


@pytest.mark.parametrize(
    'rule, message',
    [
        (dict(linen='A_{i}/w', nnx='a/w'), 'exactly once in both'),
        (dict(linen='A_{i}/w{i}', nnx='a/{i}/w'), 'exactly once in both'),
        (dict(linen='A_{i}/w', nnx='a/{i}/w', linen_stacked='S/w'), 'or neither'),
        (dict(linen='A/w', nnx='a/w', linen_stacked='S/w', nnx_stacked='s/w'), 'belong to layer rules'),
        (dict(linen='A_{i}/w', nnx='a/{i}/w', linen_stacked='S_{i}/w', nnx_stacked='s/w'), 'have no {i}'),
    ],
)
def test_malformed_rules_are_rejected(rule, message):
  with pytest.raises(PathMappingError, match=message):
    PathRule(**rule)


def test_a_rule_without_stacked_form_cannot_be_scanned():
  rule = PathRule('A_{i}/w', 'a/{i}/w')
  with pytest.raises(PathMappingError, match='no stacked form'):
    rule.path('nnx', 'scan', None)
  assert PathMapping([rule]).match_all('nnx', ('a', 3, 'w'))[0].index == 3


@pytest.mark.parametrize('name', ['GUIDE_PATHS', 'GUIDE_LOGICAL_PATHS', 'KIT_PATHS'])
def test_presets_imported_from_their_old_module_still_work_with_a_warning(name):
  import converters.paths
  import converters.presets

  with pytest.warns(DeprecationWarning, match=f'converters.presets.{name}'):
    assert getattr(converters.paths, name) is getattr(converters.presets, name)
