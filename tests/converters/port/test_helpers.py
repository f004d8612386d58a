"""`converters.port.helpers`: the file's functions that make layers, written
once for every branch, as NNX builds layers."""

from __future__ import annotations

import pytest

from converters.port import helpers, source
from converters.port.errors import Untranslatable
from tests.converters.port import linen_models


def _helper(name: str) -> helpers.HelperPort:  # a function of linen_models
  file = source.file_of(linen_models.NormedBlock)
  function = next(s for s in file.module.body if getattr(getattr(s, 'name', None), 'value', None) == name)
  return helpers.port_helper(file, function, linen_models.NormedBlock)


def test_every_branch_is_written_with_the_input_size_and_rngs_its_layers_take():
  norm = _helper('_norm')
  code = source.file_of(linen_models.NormedBlock).module.code_for_node(norm.node)
  assert 'def _norm(kind: str, *, num_features: int, rngs: nnx.Rngs) -> nnx.Module:' in code
  assert 'return nnx.RMSNorm(num_features, rngs=rngs)' in code  # the branch no trace took
  assert 'return nnx.LayerNorm(num_features, epsilon=1e-5, rngs=rngs)' in code
  # `name` only named the layers: it names the attribute instead.
  assert norm.dropped == {'name'} and norm.name_parameter == 'name'


def test_a_layer_the_port_does_not_know_is_refused():
  with pytest.raises(Untranslatable, match=r'_spectral\(...\): makes a nn.SpectralNorm'):
    _helper('_spectral')
