"""`converters.port.references`: Linen names written as NNX's where they
mean the same, respelled where NNX spells them otherwise."""

from __future__ import annotations

import libcst as cst
import pytest
from flax import linen as nn
from flax import nnx

from converters.port import references, source
from converters.port.errors import Untranslatable
from tests.converters.port import linen_models


@pytest.mark.parametrize('linen, ported', [
    (nn.relu, nnx.relu),  # the same object
    (nn.initializers.zeros_init, nnx.initializers.zeros_init),  # the same code, defined twice
    (nn.make_causal_mask, nnx.make_causal_mask),  # ... calling functions defined twice
])
def test_functions_flax_defines_for_both_frameworks_are_the_same(linen, ported):
  assert references.same_function(linen, ported)


@pytest.mark.parametrize('linen, ported', [
    (nn.combine_masks, nnx.combine_masks),  # an assert in one, a ValueError in the other
    (nn.initializers.zeros_init, nnx.initializers.ones_init),
    (nn.dot_product_attention, nnx.dot_product_attention),
])
def test_functions_that_differ_are_not(linen, ported):
  assert not references.same_function(linen, ported)


def _rewritten(code: str, strict: bool = True) -> str:
  file = source.file_of(linen_models.Stack)  # a file that imports linen as nn
  return cst.Module([]).code_for_node(cst.parse_expression(code).visit(
      references.LinenReferences(file, linen_models.Stack, strict=strict)))


def test_partitioning_is_respelled_with_its_arguments_renamed():
  assert _rewritten("nn.with_partitioning(init, (None, 'model'))") == "nnx.with_partitioning(init, (None, 'model'))"
  assert (_rewritten("nn.with_logical_partitioning(init, ('embed',), rules=RULES)")
          == "nnx.with_partitioning(init, ('embed',), sharding_rules=RULES)")
  assert (_rewritten("nn.with_logical_partitioning(fn=init, names=('embed',), mesh=m)")
          == "nnx.with_partitioning(initializer=init, sharding=('embed',), mesh=m)")


def test_framework_free_linen_functions_are_kept_and_the_rest_refused():
  assert _rewritten("nn.with_logical_constraint(x, ('batch', 'embed'))") == (
      "nn.with_logical_constraint(x, ('batch', 'embed'))")
  with pytest.raises(Untranslatable, match='nn.dot_product_attention'):
    _rewritten('nn.dot_product_attention(q, k, v)')
  assert _rewritten('nn.dot_product_attention(q, k, v)', strict=False) == 'nn.dot_product_attention(q, k, v)'


def test_twins_that_differ_only_on_bad_input_are_written_as_nnx():
  assert _rewritten('nn.combine_masks(a, b)') == 'nnx.combine_masks(a, b)'
