"""`converters.port.caches`: a decode cache made by `init_cache`, and the
proof that the port decodes as Linen does (`assert_generated_decoding`).

The model (`linen_models.decoder`) keeps a position index in its own cache
and decodes through `nn.MultiHeadDotProductAttention`, its blocks looped or
scanned. The whole port, every configuration proven, runs nightly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from converters.port import (
  assert_generated_decoding,
  decoding_configurations,
  import_file,
  prove,
)
from tests.converters.port import linen_models
from tests.converters.port.test_generate import _edited, _port, _written


@pytest.fixture(scope='module')
def decoder_file(tmp_path_factory):
  """The decoder's port as written (its proofs are the tests below)."""
  _, out = _written(tmp_path_factory.mktemp('decoder'), 'decoder', linen_models.decoder())
  return out


def test_init_cache_makes_each_cache_under_the_conditions_the_layers_are_built_under(decoder_file):
  text = decoder_file.read_text()
  # The module's own index: made by init_cache (again for a new sequence), not __init__.
  assert '''  def init_cache(self, input_shape: tuple[int, ...], dtype=None) -> None:
    """Makes the decode cache (again: a new sequence); it needs neither argument."""
    if self.decode:
      self.index = nnx.Cache(jnp.array(0, jnp.uint32))
''' in text
  assert text.count('nnx.Cache(') == 1
  # An attention layer's cache, NNX's own init_cache, where it decodes (NNX's
  # makes a cache either way), of its own dtype unless told.
  assert '''    if self.multi_head_dot_product_attention.decode:
      self.multi_head_dot_product_attention.init_cache(
          input_shape,
          dtype or self.multi_head_dot_product_attention.dtype,
      )
''' in text
  # The looped blocks one by one, the scanned stack by the vmap that made it.
  assert '''    if c.scan:
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def init_blocks_cache(block):
        block.init_cache(input_shape, dtype)

      init_blocks_cache(self.blocks)
    else:
      for block in self.blocks:
        block.init_cache(input_shape, dtype)
''' in text
  # Linen's `has_variable('cache', ...)` is always true where NNX calls: the
  # branch it guarded is read plainly, its comment kept.
  assert '''    if self.decode:
      index = self.index
      i = index[...]
      index[...] = i + 1
''' in text and 'is_initialized' not in text


def test_decoding_is_proven_position_by_position(decoder_file):
  generated = import_file(str(decoder_file))
  (model, description), = decoding_configurations(linen_models.decoder())
  assert description == 'decode=True'
  # Bit for bit with Linen's attention function in NNX's attention layers;
  # as written (NNX's fused attention, no dropout) within the stated bound.
  assert assert_generated_decoding(model, generated) == prove.FUSED_ATTENTION_ATOL


def _planted(decoder_file, tmp_path, old: str, new: str):
  text = decoder_file.read_text()
  assert old in text
  return import_file(str(_edited(decoder_file, tmp_path / 'planted_nnx.py', text.replace(old, new))))


@pytest.mark.nightly  # CI: test_a_port_wrong_from_the_third_position_on_fails_there (right at two positions, wrong at the third)
def test_a_port_reading_the_first_position_at_every_step_fails_at_the_second(decoder_file, tmp_path):
  # Right at position 0, where the index is 0: only a second step shows it.
  generated = _planted(decoder_file, tmp_path, 'dynamic_slice_in_dim(table, i, 1)', 'dynamic_slice_in_dim(table, 0, 1)')
  with pytest.raises(AssertionError, match='decoding position 1'):
    assert_generated_decoding(linen_models.decoder(decode=True), generated, as_written=False)


def test_a_port_wrong_from_the_third_position_on_fails_there(decoder_file, tmp_path):
  # Every position of the inputs is decoded, not the first two only.
  generated = _planted(decoder_file, tmp_path, 'dynamic_slice_in_dim(table, i, 1)',
                       'dynamic_slice_in_dim(table, jnp.where(i >= 2, 0, i), 1)')
  with pytest.raises(AssertionError, match='decoding position 2'):
    assert_generated_decoding(linen_models.decoder(decode=True), generated, as_written=False)


def test_an_init_cache_unlike_linens_init_is_refused(tmp_path):
  # Linen's init advances the index (no has_variable guard); NNX's
  # init_cache cannot know: the two caches differ before any step.
  _, out = _written(tmp_path, 'counter', linen_models.counter())
  with pytest.raises(AssertionError, match=r"init_cache: the port's cache is not Linen's: .*\['index'\]: values differ"):
    assert_generated_decoding(linen_models.counter(decode=True), import_file(str(out)))


def test_a_port_whose_index_stands_still_fails(decoder_file, tmp_path):
  generated = _planted(decoder_file, tmp_path, 'index[...] = i + 1', 'index[...] = i')
  with pytest.raises(AssertionError, match=r"decoding position 0: the port's cache is not Linen's: .*\['index'\]: values differ"):
    assert_generated_decoding(linen_models.decoder(decode=True), generated, as_written=False)


@pytest.mark.nightly  # CI: the written init_cache makes a fresh cache (test_init_cache_makes_each_cache_...)
def test_init_cache_again_starts_a_new_sequence(decoder_file):
  generated = import_file(str(decoder_file))
  model = generated.Decoder(linen_models.DecoderConfig(), decode=True, rngs=nnx.Rngs(0))
  model.init_cache((2, 6, 8))
  tokens = jnp.array([[1, 2], [3, 4]])
  first = model(tokens[:, :1])
  model(tokens[:, 1:])
  model.init_cache((2, 6, 8))
  np.testing.assert_array_equal(model(tokens[:, :1]), first)


@pytest.mark.nightly  # a watch on Flax, not a claim of the kit's
def test_nnx_attention_without_dropout_is_not_linen_bit_for_bit():
  """Why `prove._attention_variants` exists: if Flax makes the two agree,
  the as-written check can be exact again."""
  x = jax.random.normal(jax.random.key(0), (2, 5, 9))
  linen = nn.MultiHeadDotProductAttention(num_heads=3)
  variables = linen.init(jax.random.key(1), x)
  port = nnx.MultiHeadAttention(num_heads=3, in_features=9, decode=False, rngs=nnx.Rngs(0))
  for name in ('query', 'key', 'value', 'out'):
    getattr(port, name).kernel[...] = variables['params'][name]['kernel']
    getattr(port, name).bias[...] = variables['params'][name]['bias']
  expected = jax.jit(linen.apply)(variables, x)
  actual = nnx.jit(lambda m, x: m(x))(port, x)
  assert not np.array_equal(actual, expected)
  np.testing.assert_allclose(actual, expected, atol=prove.FUSED_ATTENTION_ATOL, rtol=0)
  port.attention_fn = prove._linen_attention_fn
  np.testing.assert_array_equal(nnx.jit(lambda m, x: m(x))(port, x), expected)


@pytest.mark.nightly  # a minute: six proofs, two of them decoding
def test_the_decoder_is_proven_looped_scanned_and_decoding_in_both(tmp_path):
  result, _, test_out = _port(tmp_path, 'decoder', linen_models.decoder())
  assert result.proven, (result.failure, result.checks)
  outcomes = {check: outcome for check, outcome, _ in result.checks}
  assert outcomes['another configuration (decode=True)'] == 'passed'
  assert outcomes['another configuration (decode=True, config.scan=True)'] == 'passed'
  assert 'test_port_decodes_as_linen_does' in test_out.read_text()


@pytest.mark.nightly  # forty seconds
def test_a_decoder_given_decoding_is_proven_without_decoding_too(tmp_path):
  from tests.converters.port.test_generate import _run_written_test

  result, _, test_out = _port(tmp_path, 'decoder_decoding', linen_models.decoder_decoding())
  assert result.proven, (result.failure, result.checks)
  outcomes = {check: outcome for check, outcome, _ in result.checks}
  assert outcomes['another configuration (decode=False)'] == 'passed'
  assert outcomes['another configuration (config.scan=True, decode=False)'] == 'passed'
  assert 'def test_port_without_decoding_is_equivalent' in test_out.read_text()
  _run_written_test(test_out, tmp_path)
