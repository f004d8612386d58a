"""`converters.port.linen_transforms`: a rule for each of Linen's lifted
transforms, naming NNX's counterpart as Flax spells it."""

from __future__ import annotations

import flax.linen as nn
import pytest
from flax import nnx
from flax.linen import transforms as linen_transforms_module

from converters.port import linen_transforms


def _linen_lifted_transforms() -> set[str]:
  return {n for n in dir(nn) if not n.startswith('_') and not n[0].isupper()
          and callable(getattr(nn, n)) and getattr(linen_transforms_module, n, None) is getattr(nn, n)}


def test_every_lifted_transform_linen_exports_has_a_rule():
  # Fails when Flax adds or removes one: give it its rule.
  assert set(linen_transforms.NAMES) == _linen_lifted_transforms()


@pytest.mark.parametrize('rule', linen_transforms.RULES, ids=lambda r: r.linen)
def test_each_rule_names_nnxs_counterpart_as_flax_spells_it(rule):
  if rule.nnx is not None:
    assert rule.nnx.startswith('nnx.') and callable(getattr(nnx, rule.nnx.removeprefix('nnx.')))
  assert rule.by_hand and (rule.nnx is None or rule.nnx in rule.by_hand)


def test_a_refusal_says_what_to_write():
  assert linen_transforms.by_hand('vmap').startswith('in NNX, call the module inside a function decorated @nnx.vmap')
  assert linen_transforms.by_hand('not_a_transform') == 'port it by hand'
