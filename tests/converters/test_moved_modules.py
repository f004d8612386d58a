"""Tests of the deprecated old module names (`converters.description` etc.): the new module, a warning, nothing altered."""

from __future__ import annotations

import importlib
import sys

import pytest

import converters


@pytest.mark.parametrize('old, new', [
    ('converters.description', 'kit_mlp.description'),
    ('converters.checkpoints', 'converters.checkpoint.inspect'),
    ('converters.processes', 'converters.distributed'),
])
def test_an_old_module_name_imports_the_new_module_with_a_warning(monkeypatch, old, new):
  monkeypatch.delitem(sys.modules, old, raising=False)
  module = importlib.import_module(new)
  with pytest.warns(DeprecationWarning, match=f'{old} moved to {new}'):
    assert importlib.import_module(old) is module
  assert module.__spec__.name == new  # the new module keeps its own spec
  assert old in converters._MOVED_MODULES
