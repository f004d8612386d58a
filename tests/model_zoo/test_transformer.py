"""The Linen transformer LM and its NNX port agree, looped and scanned, in every NNX idiom.

Everything runs under a 2x4 Auto mesh `('data', 'model')` of simulated CPU
devices; the Linen model under `nn.logical_axis_rules(RULES)`, the NNX port
under the rules only in the `'context_rules'` idiom (the others must not need
them).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from flax.traverse_util import unflatten_dict

from model_zoo import paths
from model_zoo.configs import RULES, TransformerConfig
from model_zoo.linen import transformer as linen_tf
from model_zoo.nnx import transformer as nnx_tf
from tests.model_zoo.helpers import (
    assert_same_values,
    copy_linen_to_nnx,
    expand,
    linen_flat,
    nnx_flat,
)
from tests.helpers import mesh

BATCH, LENGTH = 4, 8
CASES = [(scan, idiom) for scan in (False, True) for idiom in nnx_tf.IDIOMS]


def _case_id(case) -> str:
  scan, idiom = case
  return f"{'scanned' if scan else 'looped'}-{idiom}"


def _linen_context():
  stack = contextlib.ExitStack()
  stack.enter_context(jax.set_mesh(mesh()))
  stack.enter_context(nn.logical_axis_rules(RULES))
  return stack


def _nnx_context(idiom: str):
  stack = contextlib.ExitStack()
  stack.enter_context(jax.set_mesh(mesh()))
  if idiom == 'context_rules':
    stack.enter_context(nnx.logical_axis_rules(RULES))
  return stack


def _config(scan: bool, **overrides) -> TransformerConfig:
  return TransformerConfig(scan_layers=scan, num_layers=2, **overrides)


def _tokens(config: TransformerConfig, length: int = LENGTH) -> np.ndarray:
  return np.asarray(jax.random.randint(jax.random.key(1), (BATCH, length), 0, config.vocab_size))


@functools.cache
def _linen_init(config: TransformerConfig):
  """Linen's variables, with a `cache` for `config.max_len` tokens (one init serves both modes)."""
  model = linen_tf.TransformerLM(config, decode=True)
  with _linen_context():
    return jax.jit(model.init)(jax.random.key(0), jnp.zeros((BATCH, config.max_len), jnp.int32))


def _linen(config: TransformerConfig, decode: bool = False):
  """The Linen model and its variables; with `decode`, the cache too."""
  variables = _linen_init(config)
  if not decode:
    variables = {'params': variables['params']}
  return linen_tf.TransformerLM(config, decode=decode), variables


@functools.cache
def _nnx_created(config: TransformerConfig, idiom: str) -> nnx_tf.TransformerLM:
  with _nnx_context(idiom):
    model = nnx_tf.TransformerLM(config, idiom=idiom, rngs=nnx.Rngs(params=2, dropout=3))
  model.eval()
  return model


def _nnx(config: TransformerConfig, idiom: str) -> nnx_tf.TransformerLM:
  """A fresh NNX model in eval mode (a clone: tests change it)."""
  return nnx.clone(_nnx_created(config, idiom))


@functools.cache
def _linen_forward(config: TransformerConfig):
  model, _ = _linen(config)
  return jax.jit(functools.partial(model.apply, train=False))


def _linen_logits(config: TransformerConfig, tokens) -> jax.Array:
  _, variables = _linen(config)
  with _linen_context():
    return _linen_forward(config)(variables, tokens)


@functools.cache
def _linen_decoded(config: TransformerConfig):
  """Three tokens, Linen's logits decoding them one at a time, and the cache after."""
  model, variables = _linen(config, decode=True)
  tokens = _tokens(config, 3)
  with _linen_context():
    step = jax.jit(lambda v, t: model.apply(v, t, train=False, mutable=['cache']))
    cache, logits = variables['cache'], []
    for t in range(3):
      out, updates = step({'params': variables['params'], 'cache': cache}, tokens[:, t:t + 1])
      cache = updates['cache']
      logits.append(out)
  return tokens, logits, cache


@pytest.mark.parametrize('case', CASES, ids=_case_id)
def test_eval_logits_are_bit_identical(case):
  scan, idiom = case
  config = _config(scan)
  _, variables = _linen(config)
  tokens = _tokens(config)
  expected = _linen_logits(config, tokens)
  model = _nnx(config, idiom)
  copy_linen_to_nnx(variables, model, paths.TRANSFORMER, config.num_layers, stacked=scan)
  with _nnx_context(idiom):
    actual = nnx.jit(lambda m, t: m(t))(model, tokens)
  assert actual.shape == (BATCH, LENGTH, config.vocab_size)
  np.testing.assert_array_equal(actual, expected)


def test_rmsnorm_logits_are_bit_identical():
  scan = False
  config = _config(scan, norm='rmsnorm')
  _, variables = _linen(config)
  assert not any(path.endswith('norm/bias') for path in linen_flat(variables, 'params'))
  tokens = _tokens(config)
  model = _nnx(config, 'rules_metadata')
  copy_linen_to_nnx(variables, model, paths.TRANSFORMER, config.num_layers, stacked=scan)
  with _nnx_context('rules_metadata'):
    actual = nnx.jit(lambda m, t: m(t))(model, tokens)
  np.testing.assert_array_equal(actual, _linen_logits(config, tokens))


def test_logits_are_causal():
  config = _config(False)
  tokens = _tokens(config)
  changed = tokens.copy()
  changed[:, 5] = (changed[:, 5] + 1) % config.vocab_size
  before, after = _linen_logits(config, tokens), _linen_logits(config, changed)
  np.testing.assert_array_equal(before[:, :5], after[:, :5])
  assert not np.allclose(before[:, 5:], after[:, 5:])


def test_looped_and_scanned_linen_models_agree_on_the_same_parameters():
  """The stacked table rows name the looped rows' values, block by block."""
  looped, scanned = _config(False), _config(True)
  _, looped_vars = _linen(looped)
  stacked = {}
  looped_params = linen_flat(looped_vars, 'params')
  for row in paths.TRANSFORMER['params']:
    if '{i}' in row.linen:
      blocks = [looped_params[row.linen.format(i=i)] for i in range(looped.num_layers)]
      stacked[row.linen_stacked] = jnp.stack(blocks)
    else:
      stacked[row.linen] = looped_params[row.linen]
  params = unflatten_dict(stacked, sep='/')
  model, scanned_vars = _linen(scanned)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, nn.meta.unbox(scanned_vars['params']))
  tokens = _tokens(looped)
  with _linen_context():
    actual = jax.jit(functools.partial(model.apply, train=False))({'params': params}, tokens)
  # Same values, but XLA compiles a scan body and an unrolled loop
  # differently: they differ by a few ulp (7.6e-6 on logits of about 10).
  np.testing.assert_allclose(actual, _linen_logits(looped, tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case', CASES, ids=_case_id)
def test_decoding_three_tokens_one_at_a_time_gives_the_same_logits(case):
  scan, idiom = case
  config = _config(scan)
  linen_model, variables = _linen(config, decode=True)
  model = _nnx(config, idiom)
  with _nnx_context(idiom):
    model.init_cache(BATCH)
  copied = copy_linen_to_nnx(variables, model, paths.TRANSFORMER, config.num_layers, stacked=scan)
  per_block = 3 if scan else 3 * config.num_layers
  assert copied == len(nnx_flat(model, nnx.Param)) + 1 + per_block
  tokens, linen_logits, cache = _linen_decoded(config)
  with _nnx_context(idiom):
    nnx_step = nnx.jit(lambda m, t: m(t, decode=True))
    for t in range(3):
      logits = nnx_step(model, tokens[:, t:t + 1])
      assert logits.shape == (BATCH, 1, config.vocab_size)
      np.testing.assert_array_equal(logits, linen_logits[t], err_msg=f'token {t}')
  # The caches advanced alike: three keys and values written, indices at 3.
  assert_same_values(
      {'params': variables['params'], 'cache': cache}, model, paths.TRANSFORMER,
      config.num_layers, stacked=scan,
  )
  assert int(model.pos_embed.cache_index[...]) == 3


@pytest.mark.parametrize('scan', [False, True], ids=['looped', 'scanned'])
def test_decoding_is_the_full_forward_pass_one_position_at_a_time(scan):
  config = _config(scan)
  tokens, decoded, _ = _linen_decoded(config)
  # The cached attention runs over all `max_len` positions with a mask
  # rather than over the first three: equal up to rounding (3.8e-6 measured).
  np.testing.assert_allclose(
      jnp.concatenate(decoded, axis=1), _linen_logits(config, tokens), rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize('case', CASES, ids=_case_id)
def test_annotations_match_the_linen_boxes_in_each_idiom(case):
  scan, idiom = case
  config = _config(scan)
  _, variables = _linen(config)
  model = _nnx(config, idiom)
  boxes = jax.tree_util.tree_flatten_with_path(
      variables['params'], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
  )[0]
  boxes = {'/'.join(k.key for k in path): box for path, box in boxes}
  ported = nnx_flat(model, nnx.Param)
  linen_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh(), RULES)
  linen_shardings = {
      '/'.join(k.key for k in path): s
      for path, s in jax.tree_util.tree_flatten_with_path(linen_shardings['params'])[0]
  }
  annotated = 0
  for linen_path, nnx_path in expand(paths.TRANSFORMER['params'], config.num_layers, scan):
    if linen_path not in boxes:
      continue
    box, metadata = boxes[linen_path], ported[nnx_path].get_metadata()
    where = f'{linen_path} <-> {nnx_path}'
    if not isinstance(box, nn.LogicallyPartitioned):
      assert 'out_sharding' not in metadata, where  # bare in Linen, bare in NNX
    else:
      annotated += 1
      assert box.rules is None, where  # Linen reads the rules from the context
      if idiom == 'mesh_axes':
        resolved = tuple(nn.logical_to_mesh_axes(box.names, RULES))
        assert metadata['out_sharding'] == resolved, where
        assert 'sharding_rules' not in metadata, where
      else:
        assert metadata['out_sharding'] == box.names, where
        if idiom == 'rules_metadata':
          assert metadata['sharding_rules'] == RULES, where
        else:
          assert 'sharding_rules' not in metadata, where
    # Eager sharding placed each NNX parameter where Linen's rules put it.
    array = ported[nnx_path][...]
    assert array.sharding.is_equivalent_to(linen_shardings[linen_path], array.ndim), where
  assert annotated == 2 + 8 * (1 if scan else config.num_layers)


def test_mesh_axes_idiom_stores_resolved_names_and_layer_axis():
  model = _nnx(_config(True), 'mesh_axes')
  up = model.blocks.mlp.up.kernel.get_metadata('out_sharding')
  assert up == (None, None, 'model')  # ('layers', 'embed', 'mlp') resolved
  assert model.embed.embedding.get_metadata('out_sharding') == ('model', None)


def test_scanned_parameters_carry_the_layers_axis_on_both_sides():
  config = _config(True)
  _, variables = _linen(config)
  box = variables['params']['ScanCheckpointBlock_0']['attention']['query']['kernel']
  assert box.names == ('layers', 'embed', 'kv')
  assert box.value.shape == (2, 32, 4, 8)  # rank 4, three names: DenseGeneral's flat names
  model = _nnx(config, 'rules_metadata')
  kernel = model.blocks.attention.query.kernel
  assert kernel.get_metadata('out_sharding') == ('layers', 'embed', 'kv')
  assert kernel[...].shape == (2, 32, 4, 8)


def test_dropout_is_on_in_training_only_also_in_scanned_blocks():
  config = _config(True)
  tokens = _tokens(config)
  model = _nnx(config, 'rules_metadata')
  forward = nnx.jit(lambda m, t: m(t))
  with _nnx_context('rules_metadata'):
    evaluated = forward(model, tokens)
    model.train()
    first, second = forward(model, tokens), forward(model, tokens)
  assert not np.allclose(first, evaluated)
  assert not np.allclose(first, second)
  linen_model, variables = _linen(config)
  with _linen_context():
    trained = jax.jit(functools.partial(linen_model.apply, train=True))(
        variables, tokens, rngs={'dropout': jax.random.key(7)}
    )
  assert not np.allclose(trained, _linen_logits(config, tokens))


def test_unknown_idiom_is_refused():
  with pytest.raises(ValueError, match='idiom must be one of'):
    nnx_tf.TransformerLM(_config(False), idiom='guess', rngs=nnx.Rngs(0))


@pytest.mark.parametrize('scan', [False, True])
def test_the_port_with_fused_attention_computes_the_same_logits(scan):
  """Query, key and value side by side in one kernel, the out kernel flattened:
  the same function, bit for bit (XLA computes each projection's dot the same way)."""
  config = _config(scan)
  table = paths.transformer_fused_attention(config.num_heads)
  tokens = _tokens(config)
  with _nnx_context('rules_metadata'):
    model = nnx_tf.TransformerLM(config, attention='fused_qkv', rngs=nnx.Rngs(params=2, dropout=3))
  model.eval()
  created = nnx.jit(lambda m, t: m(t))(model, tokens)
  count = copy_linen_to_nnx(_linen(config)[1], model, table, config.num_layers, stacked=scan)
  assert count == len(expand(table['params'], config.num_layers, scan))
  with _nnx_context('rules_metadata'):
    actual = nnx.jit(lambda m, t: m(t))(model, tokens)
  np.testing.assert_array_equal(actual, _linen_logits(config, tokens))
  assert not np.allclose(created, actual)
