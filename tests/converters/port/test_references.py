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


def _rewritten_bare(code: str) -> str:
  from tests.converters.port.golden import bare_imports  # imports Linen's names bare

  file = source.file_of(bare_imports.Net)
  return cst.Module([]).code_for_node(cst.parse_module(code).visit(
      references.LinenReferences(file, bare_imports.Net)))


def test_names_imported_bare_are_where_they_are_in_linen():
  from tests.converters.port.golden import bare_imports

  file = source.file_of(bare_imports.Net)
  path = lambda code: file.linen_path(cst.parse_expression(code))  # noqa: E731
  assert path('Dense') == path('linen.Dense') == ('Dense',)
  assert path('zeros_init') == ('initializers', 'zeros')  # `from flax.linen.initializers import zeros as ...`
  assert path('linen.initializers.zeros') == ('initializers', 'zeros')
  assert path('jnp.tanh') is None and path('x') is None
  assert references.is_linen(cst.parse_expression('compact'), file, 'compact')


def test_names_imported_bare_are_written_as_nnx_and_only_where_they_are_read():
  assert _rewritten_bare('y = relu(x)\n') == 'y = nnx.relu(x)\n'
  assert _rewritten_bare('y = f(x, init=zeros_init)\n') == 'y = f(x, init=nnx.initializers.zeros)\n'
  # An attribute, a keyword or a parameter spelled as a Linen name is not one.
  assert _rewritten_bare('y = x.relu(relu=1)\n') == 'y = x.relu(relu=1)\n'
  assert _rewritten_bare('def f(relu):\n    return 1\n') == 'def f(relu):\n    return 1\n'
  with pytest.raises(Untranslatable, match='LayerNorm is used beyond creating a layer'):
    _rewritten_bare('y = LayerNorm\n')


def test_a_name_a_function_binds_is_its_own_not_linen_s():
  # `softmax` a parameter, `relu` a local, `gelu` a lambda's parameter: not Linen's there.
  code = ('def f(self, x, softmax=True):\n'
          '    relu = lambda gelu: gelu * 2\n'
          '    if softmax:\n'
          '        return relu(x)\n'
          '    return nnx_free(x)\n')
  assert _rewritten_bare(code) == code
  assert _rewritten_bare('def f(self, x):\n    return relu(x)\n') == 'def f(self, x):\n    return nnx.relu(x)\n'


def test_share_scope_of_a_local_is_read_and_other_forms_are_not():
  from tests.converters.port.golden import shared_scope

  file = source.file_of(shared_scope.FeedForward)
  local = lambda code: references.shared_scope(cst.parse_statement(code), file)  # noqa: E731
  assert local('nn.share_scope(self, gating)\n').value == 'gating'
  # The other way round, a field's module (a LoRA wrapping its `base`), a
  # value used, a keyword: not the form the port writes.
  for code in ('nn.share_scope(gating, self)\n', 'nn.share_scope(self, self.base)\n',
               'y = nn.share_scope(self, gating)\n', 'nn.share_scope(self, other=gating)\n',
               'share_scope(self, gating)\n'):
    assert local(code) is None, code
