"""`converters.port.shared_scopes`: which creations share the class's scope."""

from __future__ import annotations

import jax.numpy as jnp
import libcst as cst
import pytest

from converters import LinenModel
from converters.port import shared_scopes, source, tracing
from converters.port.errors import Untranslatable
from tests.converters.port import linen_models
from tests.converters.port.golden import shared_scope


def _read(cls, *models):
  file = source.file_of(cls)
  method = next(s for s in file.class_def(cls).body.body if isinstance(s, cst.FunctionDef))
  sites = {}
  for model in models:  # the instances of every configuration given
    root, _ = tracing.trace(model.module, *model.args, **model.kwargs)
    for instance in (i for i in root.walk() if i.cls is cls):
      for child in instance.children:
        sites.setdefault(child.site, (file.call_at(child.site), []))[1].append(child)

  def fail(node, message):
    raise Untranslatable(cls, file.line_of(node), message)

  return shared_scopes.read(method, file, sites, lambda a, b: False, fail), sites


def test_each_shared_creation_is_read_with_its_local_and_statement():
  found, sites = _read(shared_scope.FeedForward, shared_scope.model())
  assert sorted(s.local for s in found.values()) == ['gating', 'linear']
  assert all(s.statement.body[0].value.func.attr.value == 'share_scope' for s in found.values())
  assert set(found) == set(sites)


def test_what_the_port_cannot_write_so_is_refused_with_its_line():
  # Shared in one configuration, not in another (`if self.share:`).
  unshared = LinenModel(linen_models.SharedUnderACondition(share=False), jnp.ones((2, 3)))
  with pytest.raises(Untranslatable, match='where some configurations do not share its scope') as info:
    _read(linen_models.SharedUnderACondition, linen_models.shared_under_a_condition(), unshared)
  assert info.value.line is not None
  _read(linen_models.SharedUnderACondition, linen_models.shared_under_a_condition())  # one way only: read
  with pytest.raises(Untranslatable, match='which holds layers of its own'):
    _read(linen_models.SharedAttention, linen_models.shared_attention())
