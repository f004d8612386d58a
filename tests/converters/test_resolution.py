"""Tests of `converters.resolution`: what `paths=` means, decided in one place."""

from __future__ import annotations

import pytest

from converters.errors import PathMappingError
from converters.paths import Infer, PathMapping, PathRule
from converters.resolution import resolve_mapping

RULE = PathRule('Dense_0/kernel', 'up/kernel')


def test_none_keeps_every_path():
  assert resolve_mapping(None) == PathMapping.identity()


def test_a_mapping_is_used_as_given_and_rules_become_one():
  mapping = PathMapping([RULE])
  assert resolve_mapping(mapping) is mapping
  assert resolve_mapping([RULE]) == mapping


@pytest.mark.parametrize('paths', ['infer', Infer([RULE])])
def test_inferring_needs_both_models(paths):
  with pytest.raises(PathMappingError, match='pass linen_model=.* and nnx_model='):
    resolve_mapping(paths)


def test_models_beside_a_given_mapping_are_refused():
  with pytest.raises(PathMappingError, match="linen_model given with paths=None"):
    resolve_mapping(None, linen_model=object())


def test_any_other_string_is_refused():
  with pytest.raises(PathMappingError, match="paths='kit'"):
    resolve_mapping('kit')


def test_a_relayout_needs_both_layouts_of_both_models():
  with pytest.raises(PathMappingError, match='needs both layouts'):
    resolve_mapping('infer', linen_model=object(), nnx_model=object(), both_layouts=True)
