"""`infer_paths`: the path mapping of a model and its port, from what they compute.

Every model-zoo pair (every NNX annotation idiom, looped and scanned) and the
kit's MLP: the inferred mapping is the hand-written one, with no rule given,
and converting through it gives the original's outputs bit for bit. Ports
that renamed, reordered or split modules map exactly; ports that dropped a
parameter or compute differently are refused, listing what did not match.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from flax import linen as nn
from flax import nnx

from converters import (
    Infer, LinenModel, PathMapping, PathRule, Rearrange, infer_paths, linen_to_nnx, nnx_to_linen, relayout,
)
import converters
from converters.errors import DisagreementError, PathMappingError
from converters.inference import infer_models, merge_layouts
from converters.presets import KIT_PATHS
from linen_impl import model as linen_kit
from model_zoo import paths as zoo_paths
from model_zoo.configs import RULES, CNNConfig, ResNetConfig, RNNConfig, TransformerConfig
from model_zoo.linen import cnn as linen_cnn, resnet as linen_resnet, rnn as linen_rnn
from model_zoo.linen import transformer as linen_transformer
from model_zoo.nnx import cnn as nnx_cnn, resnet as nnx_resnet, rnn as nnx_rnn
from model_zoo.nnx import transformer as nnx_transformer
from nnx_impl import model as nnx_kit
from tests.converters.conversion_cases import description
from tests.converters.inference import gemma_style
from tests.helpers import assert_trees_bit_equal, in_mesh, mesh
from tests.hypothesis_profiles import compiling
from tests.model_zoo.strategies import transformer_configs

TOKENS = jax.ShapeDtypeStruct((2, 8), jnp.int32)


def images(config):
  size = getattr(config, 'image_size', 8)
  return jax.ShapeDtypeStruct((2, size, size, config.in_channels), jnp.float32)


def hand_written(table, stacked: bool = False) -> set[tuple[str, str]]:
  """A zoo table's rules as `(linen, nnx)` in one layout: looped templates, or
  the stacked paths of layer rows and the others as they are. Decode caches
  are left out: a forward pass without `decode` does not create them."""
  rows = [row for name, rows in table.items() if name != 'cache' for row in rows]
  return {
      (row.linen_stacked, row.nnx_stacked) if stacked and row.linen_stacked else (row.linen, row.nnx)
      for row in rows
  }


def inferred(mapping: PathMapping) -> set[tuple[str, str]]:
  assert all(r.transform is None and r.linen_stacked is None for r in mapping.rules)
  return {(r.linen, r.nnx) for r in mapping.rules}


def zoo_pair(name: str):
  """`(linen module, abstract NNX model, inputs, linen_kwargs, table, rules)`."""
  if name == 'cnn':
    config = CNNConfig()
    return (linen_cnn.CNN(config), lambda: nnx_cnn.CNN(config, rngs=nnx.Rngs(0)),
            images(config), {'train': False}, zoo_paths.CNN, None)
  if name == 'resnet':
    config = ResNetConfig()
    return (linen_resnet.ResNet(config), lambda: nnx_resnet.ResNet(config, rngs=nnx.Rngs(0)),
            images(config), {'train': False}, zoo_paths.RESNET, None)
  if name == 'lstm':
    config = RNNConfig()
    return (linen_rnn.RNNLM(config), lambda: nnx_rnn.RNNLM(config, rngs=nnx.Rngs(0)),
            TOKENS, {}, zoo_paths.RNN, None)
  _, idiom, layout = name.split('-')
  config = TransformerConfig(scan_layers=layout == 'scan')
  return (linen_transformer.TransformerLM(config),
          lambda: nnx_transformer.TransformerLM(config, idiom=idiom, rngs=nnx.Rngs(0)),
          TOKENS, {}, zoo_paths.TRANSFORMER, RULES)


ZOO = ['cnn', 'resnet', 'lstm'] + [
    f'transformer-{idiom}-{layout}' for idiom in nnx_transformer.IDIOMS for layout in ('loop', 'scan')
]


@pytest.mark.parametrize('name', ZOO)
def test_every_zoo_pair_infers_the_hand_written_mapping(name):
  linen, make_nnx, inputs, linen_kwargs, table, rules = zoo_pair(name)
  with in_mesh(rules):
    model = nnx.eval_shape(make_nnx)
    model.eval()
    mapping = infer_paths(linen, model, inputs, linen_kwargs=linen_kwargs)
  assert inferred(mapping) == hand_written(table, stacked=name.endswith('scan'))


@pytest.mark.parametrize('idiom', nnx_transformer.IDIOMS)
def test_both_layouts_merge_into_the_hand_written_rules_with_their_stacked_paths(idiom):
  mappings = []
  for layout in ('loop', 'scan'):
    linen, make_nnx, inputs, _, _, rules = zoo_pair(f'transformer-{idiom}-{layout}')
    with in_mesh(rules):
      model = nnx.eval_shape(make_nnx)
      model.eval()
      mappings.append(infer_paths(linen, model, inputs))
  merged = merge_layouts(*mappings)
  rows = [row for row in zoo_paths.TRANSFORMER['params']]
  assert {(r.linen, r.nnx, r.linen_stacked, r.nnx_stacked) for r in merged.rules} == {
      (row.linen, row.nnx, row.linen_stacked, row.nnx_stacked) for row in rows
  }
  with pytest.raises(PathMappingError, match='do not have the same layers'):
    merge_layouts(mappings[0], PathMapping([r for r in mappings[1].rules if 'mlp' not in r.nnx]))


def across_layouts(rows, linen_scan: bool) -> set[tuple]:
  """Hand-written rows as the mapping of a Linen model in one layout and a
  port in the other: each side's template of its own model's layout."""
  return {
      ((None, r.nnx, r.linen_stacked, None) if linen_scan else (r.linen, None, None, r.nnx_stacked))
      if r.linen_stacked else (r.linen, r.nnx, None, None)
      for r in rows
  }


def rule_set(mapping: PathMapping) -> set[tuple]:
  return {(r.linen, r.nnx, r.linen_stacked, r.nnx_stacked) for r in mapping.rules}


@pytest.mark.parametrize('idiom', nnx_transformer.IDIOMS)
@pytest.mark.parametrize('scanned', ['linen', 'nnx'])
def test_a_model_that_scans_maps_to_a_port_that_loops(scanned, idiom):
  """Each stacked variable's layers, traced with the scan unrolled, pair
  with one looped family: the stacked path on one side, `{i}` on the other."""
  linen, _, inputs, _, _, rules = zoo_pair(f'transformer-{idiom}-{"scan" if scanned == "linen" else "loop"}')
  make_nnx = zoo_pair(f'transformer-{idiom}-{"scan" if scanned == "nnx" else "loop"}')[1]
  with in_mesh(rules):
    model = nnx.eval_shape(make_nnx)
    model.eval()
    mapping = infer_paths(linen, model, inputs)
  assert rule_set(mapping) == across_layouts(zoo_paths.TRANSFORMER['params'], scanned == 'linen')


# Nightly; CI: test_a_model_that_scans_maps_to_a_port_that_loops (inference across layouts),
# test_the_kits_mlp_infers_its_preset (the kit's MLP) and test_api.py's
# test_a_mapping_with_one_layout_per_side_converts_training_states_across_layouts.
@pytest.mark.nightly
@pytest.mark.parametrize('linen_scan', [True, False], ids=['linen_scan', 'linen_loop'])
def test_the_kits_mlp_maps_across_layouts_and_converts_through_it(linen_scan):
  linen_desc, nnx_desc = description('device', linen_scan), description('device', not linen_scan)
  x = jax.ShapeDtypeStruct((linen_desc.batch, linen_desc.depth), jnp.float32)
  with in_mesh():
    model = nnx.eval_shape(lambda: nnx_kit.MLP(nnx_desc, rngs=nnx.Rngs(0)))
    mapping = infer_paths(linen_kit.MLP(linen_desc), model, x)
    assert rule_set(mapping) == across_layouts(KIT_PATHS.rules, linen_scan)
    init = linen_kit.MLP(linen_desc).init
    abstract = jax.eval_shape(init, jax.random.key(0), x)
    variables = jax.jit(init, out_shardings=nn.get_sharding(abstract, mesh()))(jax.random.key(0), jnp.ones(x.shape))
    ported = linen_to_nnx(variables, target=model, paths=mapping)
    expected = linen_to_nnx(variables, target=model, scan=not linen_scan, paths=KIT_PATHS)
    assert_same_values(nnx.state(ported, nnx.Param), nnx.state(expected, nnx.Param))
    assert_same_values(nnx_to_linen(ported, paths=mapping), variables)


@pytest.mark.parametrize('use_scan', [False, True], ids=['loop', 'scan'])
def test_the_kits_mlp_infers_its_preset(use_scan):
  desc = description('device', use_scan)
  x = jax.ShapeDtypeStruct((desc.batch, desc.depth), jnp.float32)
  with in_mesh():
    model = nnx.eval_shape(lambda: nnx_kit.MLP(desc, rngs=nnx.Rngs(0)))
    mapping = infer_paths(linen_kit.MLP(desc), model, x)
  layout = 'scan' if use_scan else 'loop'
  assert inferred(mapping) == {
      (r.template('linen', layout), r.template('nnx', layout)) for r in KIT_PATHS.rules
  }


@pytest.mark.nightly  # CI: test_conversions_take_paths_infer_with_the_two_models (the transformer through its inferred mapping, bit for bit)
def test_converting_through_the_inferred_mapping_gives_the_originals_outputs():
  linen, make_nnx, inputs, _, _, rules = zoo_pair('transformer-context_rules-loop')
  tokens = jax.random.randint(jax.random.key(1), inputs.shape, 0, 64)
  with in_mesh(rules):
    model = make_nnx()
    model.eval()
    mapping = infer_paths(linen, model, inputs)
    abstract = jax.eval_shape(linen.init, jax.random.key(0), tokens)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh(), rules)
    variables = jax.jit(linen.init, out_shardings=shardings)(jax.random.key(0), tokens)
    ported = linen_to_nnx(variables, target=model, paths=mapping)
    expected = linen.apply(variables, tokens)
    np.testing.assert_array_equal(np.asarray(ported(tokens)), np.asarray(expected))


def translated(mapping: PathMapping, paths, nnx_layout: str) -> dict[str, str]:
  """Where `mapping` sends each Linen path (`'linen/path' -> 'nnx/path'`, a
  stacked one -> its layers' paths when the port loops, a looped one's
  layer -> its stacked path when it scans)."""
  out = {}
  for path in paths:
    (match,) = mapping.match_all('linen', path)
    rule, layout = match.rule, match.layout
    if layout == 'plain' or layout == nnx_layout:
      out['/'.join(path)] = '/'.join(map(str, rule.path('nnx', layout, match.index)))
    elif layout == 'loop':  # one layer of the port's stacked variable
      out['/'.join(path)] = '/'.join(map(str, rule.path('nnx', 'scan', None))) + f'[{match.index}]'
    else:  # stacked -> looped: its layers' paths, by layer 0's
      out['/'.join(path)] = '/'.join(map(str, rule.path('nnx', 'loop', 0)))
  return out


@pytest.mark.nightly  # CI: test_every_zoo_pair_infers_the_hand_written_mapping, test_a_model_that_scans_maps_to_a_port_that_loops
@compiling
@given(
    config=transformer_configs(), idiom=st.sampled_from(nnx_transformer.IDIOMS),
    port_layout=st.sampled_from(['same', 'other']),
)
def test_random_transformers_infer_what_the_hand_written_mapping_says(config, idiom, port_layout):
  """Any depth, width, heads, norm and layout, the port in the same layout
  or the other: every variable goes where the hand-written table sends it
  (one block folds to no template: a single layer is not a loop, and its
  rule names it)."""
  linen = linen_transformer.TransformerLM(config)
  port_config = config if port_layout == 'same' else dataclasses.replace(config, scan_layers=not config.scan_layers)
  tokens = jax.ShapeDtypeStruct((2, config.max_len), jnp.int32)
  with in_mesh(RULES):
    model = nnx.eval_shape(lambda: nnx_transformer.TransformerLM(port_config, idiom=idiom, rngs=nnx.Rngs(0)))
    model.eval()
    mapping = infer_paths(linen, model, tokens)
    variables = jax.eval_shape(linen.init, jax.random.key(0), tokens)
  paths = [
      tuple(str(k.key) for k in keypath)
      for keypath, _ in jax.tree_util.tree_flatten_with_path(
          variables['params'], is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))[0]
  ]
  hand = PathMapping([
      PathRule(r.linen, r.nnx, r.linen_stacked, r.nnx_stacked) for r in zoo_paths.TRANSFORMER['params']
  ])
  nnx_layout = 'scan' if port_config.scan_layers else 'loop'
  assert translated(mapping, paths, nnx_layout) == translated(hand, paths, nnx_layout)
  if config.num_layers > 1 and not config.scan_layers and port_layout == 'same':
    assert all(r.layered for r in mapping.rules if 'Block' in r.linen)


# -- ports that nobody on the kit wrote --------------------------------------------


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(16)(x))
    return nn.Dense(4)(nn.LayerNorm()(h)) + nn.Dense(4, use_bias=False)(h)


class Head(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(16, rngs=rngs)
    self.proj = nnx.Linear(16, 4, rngs=rngs)


class NNXNet(nnx.Module):
  """The port: attributes renamed, defined in another order, the head split off."""

  def __init__(self, rngs: nnx.Rngs, bias: bool = True, skip_input: str = 'hidden'):
    self.skip = nnx.Linear(16, 4, use_bias=False, rngs=rngs)
    self.head = Head(rngs)
    self.up = nnx.Linear(8, 16, use_bias=bias, rngs=rngs)
    self.skip_input = skip_input

  def __call__(self, x):
    h = nnx.relu(self.up(x))
    skipped = h if self.skip_input == 'hidden' else x @ jnp.ones((8, 16))
    return self.head.proj(self.head.norm(h)) + self.skip(skipped)


X = jax.ShapeDtypeStruct((2, 8), jnp.float32)
NET_PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'up/kernel'), PathRule('Dense_0/bias', 'up/bias'),
    PathRule('LayerNorm_0/scale', 'head/norm/scale'), PathRule('LayerNorm_0/bias', 'head/norm/bias'),
    PathRule('Dense_1/kernel', 'head/proj/kernel'), PathRule('Dense_1/bias', 'head/proj/bias'),
    PathRule('Dense_2/kernel', 'skip/kernel'),
])


def test_a_port_that_renamed_reordered_and_split_modules_maps_exactly():
  mapping = infer_paths(LinenNet(), NNXNet(nnx.Rngs(0)), X)
  assert mapping == NET_PATHS  # in the order the computation uses them


class LinenGLU(nn.Module):
  """Two kernels of one shape reading one input: only the sigmoid tells them apart."""

  @nn.compact
  def __call__(self, x, _=None):
    value, gate = nn.Dense(8, name='value')(x), nn.Dense(8, name='gate')(x)
    return value * nn.sigmoid(gate), None


class NNXGLU(nnx.Module):
  """The port computes the gate first and multiplies the other way round."""

  def __init__(self, rngs: nnx.Rngs):
    self.gate = nnx.Linear(8, 8, rngs=rngs)
    self.value = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, x):
    return jax.nn.sigmoid(self.gate(x)) * self.value(x)


class LinenScannedGLUs(nn.Module):
  @nn.compact
  def __call__(self, x):
    scanned = nn.scan(LinenGLU, variable_axes={'params': 0}, split_rngs={'params': True}, length=3)
    return scanned(name='blocks')(x, None)[0]


class NNXLoopedGLUs(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.layers = nnx.List([NNXGLU(rngs) for _ in range(3)])

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


@pytest.mark.parametrize('scanned', [False, True], ids=['glu', 'scanned_glus_to_a_loop'])
def test_operands_that_commute_do_not_tell_variables_apart(scanned):
  """`sigmoid(g) * v` is `v * sigmoid(g)`: what tells the two kernels apart
  is the sigmoid, whichever operand of the product each is."""
  linen = LinenScannedGLUs() if scanned else LinenGLU()
  model = NNXLoopedGLUs(nnx.Rngs(0)) if scanned else NNXGLU(nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (4, 8))
  mapping = infer_paths(linen, model, x)
  variables = linen.init(jax.random.key(1), x)
  ported = linen_to_nnx(variables, target=model, paths=mapping)
  expected = linen.apply(variables, x) if scanned else linen.apply(variables, x)[0]
  np.testing.assert_allclose(np.asarray(ported(x)), np.asarray(expected), rtol=1e-6, atol=1e-6)
  gates = {r.nnx for r in mapping.rules if 'gate' in (r.linen or r.linen_stacked)}
  assert gates and all('gate' in p for p in gates)


def test_rules_given_across_layouts_anchor_layer_by_layer():
  # The Linen model scans, the port loops: each given rule pairs a stack with
  # a `{i}` family, which anchors only once the scans are unrolled (with every
  # variable given, the scanned graphs have nothing left to pair).
  given = [
      PathRule(None, f'layers/{{i}}/{name}/{kind}', linen_stacked=f'blocks/{name}/{kind}')
      for name in ('value', 'gate') for kind in ('kernel', 'bias')
  ]
  linen, model = LinenScannedGLUs(), NNXLoopedGLUs(nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (4, 8))
  mapping = infer_paths(linen, model, x, paths=given[:1])  # one given, the rest inferred
  assert set(mapping.rules) == set(given)
  assert set(infer_paths(linen, model, x, paths=given).rules) == set(given)  # all given, proven
  variables = linen.init(jax.random.key(1), x)
  ported = linen_to_nnx(variables, target=model, paths=mapping)
  np.testing.assert_allclose(np.asarray(ported(x)), np.asarray(linen.apply(variables, x)), rtol=1e-6, atol=1e-6)


class NNXBackwardGLUs(NNXLoopedGLUs):
  """A port that runs its layers last to first."""

  def __call__(self, x):
    for layer in reversed(self.layers):
      x = layer(x)
    return x


def test_a_port_that_runs_the_scanned_layers_backwards_is_refused_saying_so():
  # Layer i of the stack pairs with `layers/{2 - i}`, which no rule writes:
  # refused, saying what to change, never converted layer i to layer i.
  with pytest.raises(PathMappingError) as e:
    infer_paths(LinenScannedGLUs(), NNXBackwardGLUs(nnx.Rngs(0)), jax.ShapeDtypeStruct((4, 8), jnp.float32))
  message = str(e.value)
  assert 'linen blocks/gate/kernel (stacked): its layers pair with nnx layers/{i}/gate/kernel in reverse order' in message
  assert "store the port's layers so that its layer i is the Linen model's layer i" in message
  assert 'give the rules' not in message  # no rule could say it


class NNXScaledGLU(NNXGLU):
  """A port that scales the input first: a scale by a constant is no step of
  the structure, so the value and the gate still pair by the sigmoid."""

  def __call__(self, x):
    return super().__call__(x * 1.0)


def test_a_scale_applied_at_another_step_pairs_as_the_original():
  x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
  mapping = infer_paths(LinenGLU(), NNXScaledGLU(nnx.Rngs(0)), x)
  assert {(r.linen, r.nnx) for r in mapping.rules} == {
      (f'{name}/{kind}', f'{name}/{kind}') for name in ('value', 'gate') for kind in ('kernel', 'bias')
  }


def test_a_port_that_dropped_a_parameter_is_refused_naming_it():
  with pytest.raises(PathMappingError) as e:
    infer_paths(LinenNet(), NNXNet(nnx.Rngs(0), bias=False), X)
  assert 'linen Dense_0/bias (params, (16,) float32, add): no NNX variable' in str(e.value)
  assert 'no counterpart of its size was dropped or added by the port' in str(e.value)


def test_a_port_that_computes_differently_is_refused_with_the_candidates():
  with pytest.raises(PathMappingError) as e:
    infer_paths(LinenNet(), NNXNet(nnx.Rngs(0), skip_input='input'), X)
  message = str(e.value)
  assert 'linen Dense_2/kernel (params, (16, 4) float32, dot_general operand 1)' in message
  assert 'NNX candidates of its size, used otherwise: skip/kernel' in message
  assert set(e.value.paths) == {'linen Dense_2/kernel', 'nnx skip/kernel'}
  assert 'one stored transposed, reshaped or split needs its rule' in message
  assert 'dropped or added' not in message


def test_refusals_are_folded_by_layer_one_line_for_a_family():
  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      for i in range(4):
        x = nn.Dense(8, name=f'layers_{i}')(x)
      return x

  class Port(nnx.Module):  # every layer's bias dropped
    def __init__(self, rngs):
      self.layers = nnx.List([nnx.Linear(8, 8, use_bias=False, rngs=rngs) for _ in range(4)])

    def __call__(self, x):
      for layer in self.layers:
        x = layer(x)
      return x

  with pytest.raises(PathMappingError) as e:
    infer_paths(Linen(), Port(nnx.Rngs(0)), jnp.ones((2, 8)))
  message = str(e.value)
  assert 'linen layers_{i}/bias (layers 0-3) (params, (8,) float32, add)' in message
  assert message.count('no NNX variable') == 1


def test_query_key_value_fused_in_every_layer_are_inferred_as_the_hand_written_rules():
  # (Given rules winning over inference: test_a_given_rule_wins_and_inference_fills_only_what_it_leaves.)
  config = TransformerConfig()
  fused = zoo_paths.transformer_fused_attention(config.num_heads)['params']
  hand_written = PathMapping([
      PathRule(row.linen, row.nnx, transform=Rearrange(row.pattern, **dict(row.sizes)) if row.pattern else None)
      for row in fused
  ])
  linen = linen_transformer.TransformerLM(config)
  with in_mesh(RULES):
    model = nnx.eval_shape(lambda: nnx_transformer.TransformerLM(
        config, idiom='rules_metadata', attention='fused_qkv', rngs=nnx.Rngs(0)))
    model.eval()
    inferred = infer_paths(linen, model, TOKENS)
    variables = jax.jit(linen.init)(jax.random.key(1), jnp.zeros(TOKENS.shape, TOKENS.dtype))
  # The fused kernel of every layer is one `{i}` rule that lays the arrays
  # out as the hand-written one does.
  assert {(r.linen, r.nnx) for r in inferred.rules} == {(row.linen, row.nnx) for row in fused}
  bare = nn.meta.unbox(variables)
  assert_trees_bit_equal(
      nnx.to_pure_dict(linen_to_nnx(bare, paths=inferred)), nnx.to_pure_dict(linen_to_nnx(bare, paths=hand_written)))


@pytest.mark.nightly  # CI: test_batch_norm_in_training_pairs_its_statistics (the same retry, mutable)
def test_a_linen_call_that_writes_a_collection_is_traced_once_mutable():
  """A decode step writes the cache; the retry leaves no trace of the failed call."""
  linen = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=6, decode=True)
  model = nnx.MultiHeadAttention(num_heads=2, in_features=4, qkv_features=6, decode=True, rngs=nnx.Rngs(0))
  token = jax.ShapeDtypeStruct((1, 1, 4), jnp.float32)  # Linen's init makes a cache this long
  model.init_cache(token.shape)
  mapping = infer_paths(linen, model, token)
  pairs = {(r.linen, r.nnx) for r in mapping.rules}
  assert ('query/kernel', 'query/kernel') in pairs and ('cached_key', 'cached_key') in pairs


def test_batch_norm_in_training_pairs_its_statistics():
  linen = nn.BatchNorm(use_running_average=False)
  model = nnx.BatchNorm(4, rngs=nnx.Rngs(0))
  model.train()
  mapping = infer_paths(linen, model, jax.ShapeDtypeStruct((8, 4), jnp.float32))
  assert {(r.linen, r.nnx) for r in mapping.rules} == {
      ('scale', 'scale'), ('bias', 'bias'), ('mean', 'mean'), ('var', 'var')
  }


def test_an_array_attribute_of_the_port_is_a_constant_kept_from_the_target():
  """Flax's own masked `nnx.Conv` keeps the mask as an array attribute."""
  mask = jnp.ones((3, 3, 2, 4)).at[0].set(0.0)
  linen = nn.Conv(4, (3, 3), mask=mask)
  model = nnx.Conv(2, 4, (3, 3), mask=mask, rngs=nnx.Rngs(0))
  mapping = infer_paths(linen, model, jax.ShapeDtypeStruct((1, 5, 5, 2), jnp.float32))
  assert {(r.linen, r.nnx, r.only) for r in mapping.rules} == {
      ('kernel', 'kernel', None), ('bias', 'bias', None), (None, 'mask', 'nnx')
  }
  x = np.linspace(-1, 1, 50, dtype=np.float32).reshape(1, 5, 5, 2)
  variables = linen.init(jax.random.key(1), x)
  port = converters.linen_to_nnx(variables, target=model, paths='infer', linen_model=LinenModel(linen, x))
  assert port.mask is model.mask
  np.testing.assert_array_equal(port(x), linen.apply(variables, x))


def test_a_variable_of_no_linen_collection_is_inferred_as_the_ports_own_constant():
  """A positional table the port holds in a bare `nnx.Variable` and Linen
  computes on the fly: the witness runs the port holding it at its value."""
  from tests.converters.checkpoint import small_models as small

  x = jax.ShapeDtypeStruct((2, 8), jnp.float32)
  expected = small.TABLE_VARIABLE_PATHS
  assert infer_paths(small.LinenTabled(), small.nnx_table_variable(), x) == expected
  # From a function (abstract), the table alone is made, under jax.jit.
  assert infer_models(small.linen_tabled, small.nnx_table_variable) == expected
  with pytest.raises(PathMappingError, match=r'abstract and holds state of its own .*: table;'):
    infer_paths(small.LinenTabled(), nnx.eval_shape(small.nnx_table_variable), x)


def test_state_of_the_port_that_is_not_what_linen_computes_is_refused_not_kept():
  from tests.converters.checkpoint import small_models as small

  class Shifted(small.NNXTableVariable):
    def __init__(self, rngs):
      super().__init__(rngs)
      self.table = nnx.Variable(small.sinusoid() + 1.0)

  x = jax.ShapeDtypeStruct((2, 8), jnp.float32)
  with pytest.raises(PathMappingError, match='models disagree when run through that pairing'):
    infer_paths(small.LinenTabled(), Shifted(nnx.Rngs(0)), x)


def test_a_variable_type_of_the_users_own_with_no_collection_is_refused_not_guessed():
  """A type of one's own names a kind of state (a trained table, a collection
  `collections=` forgot): not taken for a constant however the witness ran."""
  from tests.converters.checkpoint import small_models as small

  with pytest.raises(converters.StructureError, match=r"table: no Linen collection is known for the Variable type PositionTable; .*collections=.*PathRule.nnx_only\('table'\)"):
    infer_paths(small.LinenTabled(), small.NNXLearnedTable(nnx.Rngs(0)), jax.ShapeDtypeStruct((2, 8), jnp.float32))


def test_a_variable_of_no_linen_collection_the_call_writes_is_refused_as_state():
  class Counting(nnx.Module):
    def __init__(self):
      self.calls = nnx.Variable(jnp.zeros((), jnp.int32))
      self.dense = nnx.Linear(8, 4, rngs=nnx.Rngs(0))

    def __call__(self, x):
      self.calls[...] += 1
      return self.dense(x)

  with pytest.raises(converters.StructureError, match=r'calls: no Linen collection is known for the Variable type Variable'):
    infer_paths(nn.Dense(4), Counting(), jax.ShapeDtypeStruct((2, 8), jnp.float32))


def test_the_mapping_prints_as_python_that_rebuilds_it():
  source = NET_PATHS.to_python('NET')
  assert source.startswith('from converters import PathMapping, PathRule\n\nNET = PathMapping([\n')
  namespace: dict = {}
  exec(source, namespace)
  assert namespace['NET'] == NET_PATHS
  fused = PathMapping(
      [PathRule(('q', 'k'), 'qk', transform=Rearrange('e h -> e (two h)'))], keep_unmatched=True
  )
  namespace = {}
  exec(fused.to_python(), namespace)
  assert namespace['PATHS'] == fused


# -- paths='infer' of the conversions ----------------------------------------------


def transformer_models(idiom: str = 'context_rules'):
  """Factories of both layouts of the zoo transformer and its port."""
  def linen(layout: str = 'loop') -> LinenModel:
    config = TransformerConfig(scan_layers=layout == 'scan')
    return LinenModel(linen_transformer.TransformerLM(config), TOKENS)

  def port(layout: str = 'loop') -> nnx.Module:
    config = TransformerConfig(scan_layers=layout == 'scan')
    return nnx_transformer.TransformerLM(config, idiom=idiom, rngs=nnx.Rngs(0))

  return linen, port


def initialised(linen: LinenModel, tokens):
  abstract = jax.eval_shape(linen.module.init, jax.random.key(0), tokens)
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh(), RULES)
  return jax.jit(linen.module.init, out_shardings=shardings)(jax.random.key(0), tokens)


def assert_same_values(*trees) -> None:
  """Every tree has the same leaves at the same paths, bit for bit."""
  flats = [
      {jax.tree_util.keystr(k): np.asarray(v)
       for k, v in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(tree))}
      for tree in trees
  ]
  for flat in flats[1:]:
    assert flat.keys() == flats[0].keys()
    for key, value in flat.items():
      np.testing.assert_array_equal(value, flats[0][key], err_msg=key)


def test_conversions_take_paths_infer_with_the_two_models():
  make_linen, make_port = transformer_models()
  tokens = jax.random.randint(jax.random.key(1), TOKENS.shape, 0, 64)
  with in_mesh(RULES):
    variables = initialised(make_linen(), tokens)
    target = make_port()
    graphdef, before = nnx.graphdef(target), nnx.state(target, nnx.Param)
    ported = linen_to_nnx(variables, target=target, paths='infer', linen_model=make_linen())
    # The target is a template: not put in eval mode, nothing replaced.
    assert nnx.graphdef(target) == graphdef
    assert_same_values(nnx.state(target, nnx.Param), before)
    ported.eval()
    expected = make_linen().module.apply(variables, tokens)
    np.testing.assert_array_equal(np.asarray(ported(tokens)), np.asarray(expected))
    back = nnx_to_linen(ported, paths='infer', linen_model=make_linen())
    state = nnx.state(ported, nnx.Not(nnx.RngState))
    again = nnx_to_linen(state, paths='infer', linen_model=make_linen, nnx_model=make_port)
  assert_same_values(variables, back, again)


# Nightly; CI: both layouts' inferences merged through the API
# (test_both_layouts_merge_into_the_hand_written_rules_with_their_stacked_paths,
# test_conversions_take_paths_infer_with_the_two_models), and through the checkpoint tool's `map`
# against the hand-written mapping (test_user_models.py's test_map_prints_the_inferred_mapping_as_python_and_json).
@pytest.mark.nightly
def test_factories_of_both_layouts_infer_conversions_that_change_the_layout():
  make_linen, make_port = transformer_models('rules_metadata')
  tokens = jax.random.randint(jax.random.key(1), TOKENS.shape, 0, 64)
  hand_written_paths = PathMapping([
      PathRule(r.linen, r.nnx, r.linen_stacked, r.nnx_stacked) for r in zoo_paths.TRANSFORMER['params']
  ])
  with in_mesh(RULES):
    variables = initialised(make_linen('loop'), tokens)
    stacked = relayout(
        variables, scan=True, layer_partition='layers', paths='infer',
        linen_model=make_linen, nnx_model=make_port,
    )
    assert_same_values(
        relayout(variables, scan=True, layer_partition='layers', paths=hand_written_paths), stacked
    )
    ported = linen_to_nnx(
        variables, target=make_port('scan'), scan=True, layer_partition='layers', paths='infer',
        linen_model=make_linen, nnx_model=make_port,
    )
    ported.eval()
    # Scanned models, Linen's and the port, compile to one program: bit for bit.
    expected = make_linen('scan').module.apply(stacked, tokens)
    np.testing.assert_array_equal(np.asarray(ported(tokens)), np.asarray(expected))
    with pytest.raises(PathMappingError, match='needs both layouts of both models'):
      relayout(variables, scan=True, paths='infer', linen_model=make_linen(), nnx_model=make_port)


def test_paths_infer_without_a_model_or_with_models_unused_is_refused():
  make_linen, make_port = transformer_models()
  with in_mesh(RULES):
    variables = jax.eval_shape(make_linen().module.init, jax.random.key(0), TOKENS)
    model = nnx.eval_shape(make_port)
    with pytest.raises(PathMappingError, match=r'pass linen_model=LinenModel\(module'):
      linen_to_nnx(variables, target=model, paths='infer')
    with pytest.raises(PathMappingError, match='and nnx_model='):
      linen_to_nnx(variables, paths='infer')
    with pytest.raises(PathMappingError, match='pass nnx_model='):
      nnx_to_linen(nnx.state(model, nnx.Not(nnx.RngState)), paths='infer', linen_model=make_linen())
    with pytest.raises(PathMappingError, match="linen_model given with paths=None.*paths='infer'"):
      linen_to_nnx(variables, target=model, linen_model=make_linen())
    with pytest.raises(PathMappingError, match="paths='guess'"):
      linen_to_nnx(variables, target=model, paths='guess')
    with pytest.raises(PathMappingError, match='a Linen module alone has no inputs'):
      linen_to_nnx(variables, target=model, paths='infer', linen_model=make_linen().module)
    with pytest.raises(PathMappingError, match=r'linen_model: calling .* failed: RuntimeError: no'):
      linen_to_nnx(
          variables, target=model, paths='infer',
          linen_model=lambda: (_ for _ in ()).throw(RuntimeError('no')),
      )


def test_a_factory_of_both_layouts_beside_a_model_of_one_takes_that_models_layout():
  make_linen, make_port = transformer_models()
  with in_mesh(RULES):
    model = nnx.eval_shape(lambda: make_port('scan'))
    mapping = infer_models(make_linen, model)
  assert rule_set(mapping) == {
      (r.linen_stacked, r.nnx_stacked, None, None) if r.linen_stacked else (r.linen, r.nnx, None, None)
      for r in zoo_paths.TRANSFORMER['params']
  }


def test_known_rules_and_inference_together_convert_a_port():
  from tests.converters.inference.ports import CASES

  case = CASES['square_kernel_stored_transposed']  # the port keeps the kernel (out, in)
  variables = jax.jit(case.linen.init)(jax.random.key(1), *case.inputs)
  linen = LinenModel(case.linen, *case.inputs)
  target = case.make_nnx(nnx.Rngs(0))
  known = [PathRule('dense/kernel', 'kernel', transform=Rearrange('i o -> o i'))]
  expected = np.asarray(case.linen.apply(variables, *case.inputs))
  ported = linen_to_nnx(variables, target=target, paths=Infer(known), linen_model=linen)
  np.testing.assert_array_equal(np.asarray(ported(*case.inputs)), expected)
  # Inference alone finds the transposition too, and proves it.
  alone = linen_to_nnx(variables, target=target, paths='infer', linen_model=linen)
  np.testing.assert_array_equal(np.asarray(alone(*case.inputs)), expected)
  with pytest.raises(PathMappingError, match='PathRule'):
    Infer(['dense/kernel'])


class TransposedLayers(nn.Module):
  head: bool = False

  @nn.compact
  def __call__(self, x):
    for i in range(4):
      x = jnp.tanh(nn.Dense(8, use_bias=False, name=f'layers_{i}')(x))
    return nn.Dense(8, use_bias=False, name='layers_4')(x) if self.head else x


class TransposedLayersPort(nnx.Module):
  """Every kernel kept (out, in); the head, if any, an ordinary Linear."""

  def __init__(self, rngs, head: bool = False):
    self.kernels = nnx.List([nnx.Param(jax.random.normal(rngs.params(), (8, 8))) for _ in range(4)])
    self.head = nnx.Linear(8, 8, use_bias=False, rngs=rngs) if head else None

  def __call__(self, x):
    for k in self.kernels:
      x = jnp.tanh(jnp.einsum('bi,oi->bo', x, k[...]))
    return self.head(x) if self.head is not None else x


@pytest.mark.parametrize('head', [False, True])
def test_kernels_stored_transposed_in_every_layer_map_with_their_transform(head):
  x = jax.random.normal(jax.random.key(3), (2, 8))
  mapping = infer_paths(TransposedLayers(head), TransposedLayersPort(nnx.Rngs(0), head), x)
  transposed = [r for r in mapping.rules if r.transform is not None]
  assert {r.transform.pattern for r in transposed} == {'a b -> b a'}
  if head:  # `layers_{i}` would also name the head: one rule per layer
    assert len(transposed) == 4 and all('{i}' not in r.linen for r in transposed)
  else:
    assert [(r.linen, r.nnx) for r in transposed] == [('layers_{i}/kernel', 'kernels/{i}')]
  # Proven by the outputs of the port converted through it.
  variables = TransposedLayers(head).init(jax.random.key(1), x)
  port = linen_to_nnx(variables, target=TransposedLayersPort(nnx.Rngs(0), head), paths=mapping)
  np.testing.assert_allclose(  # einsum beside a matmul: rounding may differ
      np.asarray(port(x)), np.asarray(TransposedLayers(head).apply(variables, x)), rtol=1e-6, atol=1e-6
  )


# -- found by an adversarial review of the transform search ---------------------------


class KernelFirst(nnx.Module):
  """A true port of `nn.Dense(4)`: the kernel stored as Linen's, the
  contraction written kernel-first (roles differ; nothing is transposed)."""

  def __init__(self, rngs):
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (4, 4)))
    self.bias = nnx.Param(jnp.zeros((4,)))

  def __call__(self, x):
    return jax.lax.dot_general(self.kernel[...], x, (((0,), (1,)), ((), ()))).T + self.bias[...]


@pytest.mark.parametrize('example', ['zeros', 'ones', 'random'])
def test_a_contraction_written_kernel_first_is_never_given_a_transpose(example):
  # Zeros hide the kernel from the witness: the identity and the transpose are
  # both proven, so neither is chosen (before, only the transpose was tried).
  x = {'zeros': jnp.zeros((3, 4)), 'ones': jnp.ones((3, 4)),
       'random': jax.random.normal(jax.random.key(5), (3, 4))}[example]
  linen = nn.Dense(4, name='dense')
  try:
    mapping = infer_paths(linen, KernelFirst(nnx.Rngs(0)), x)
  except PathMappingError:
    assert example == 'zeros'
    return
  assert all(r.transform is None for r in mapping.rules)
  fresh = jax.random.normal(jax.random.key(11), (3, 4))
  variables = linen.init(jax.random.key(1), fresh)
  port = linen_to_nnx(variables, target=KernelFirst(nnx.Rngs(0)), paths=mapping)
  np.testing.assert_allclose(np.asarray(port(fresh)), np.asarray(linen.apply(variables, fresh)), rtol=1e-6, atol=1e-6)


def test_a_transform_in_one_layer_is_not_folded_over_by_the_others():
  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      for _ in range(3):
        x = jnp.tanh(nn.Dense(4, use_bias=False)(x))
      return x

  class Port(nnx.Module):  # only the middle kernel kept (out, in)
    def __init__(self, rngs):
      self.layers = nnx.List([nnx.Param(jax.random.normal(rngs.params(), (4, 4))) for _ in range(3)])

    def __call__(self, x):
      for i, k in enumerate(self.layers):
        x = jnp.tanh(jnp.einsum('bi,oi->bo', x, k[...]) if i == 1 else x @ k[...])
      return x

  x = jax.random.normal(jax.random.key(5), (2, 4))
  mapping = infer_paths(Linen(), Port(nnx.Rngs(0)), x)
  variables = Linen().init(jax.random.key(1), x)
  port = linen_to_nnx(variables, target=Port(nnx.Rngs(0)), paths=mapping)  # no two rules for one path
  np.testing.assert_allclose(np.asarray(port(x)), np.asarray(Linen().apply(variables, x)), rtol=1e-6, atol=1e-6)


def test_a_model_that_returns_a_parameter_as_it_is_is_witnessed():
  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      w = self.param('w', nn.initializers.normal(), (4, 4))
      return x @ w, w

  class Port(nnx.Module):
    def __init__(self, rngs):
      self.w = nnx.Param(jax.random.normal(rngs.params(), (4, 4)))

    def __call__(self, x):
      return x @ self.w[...], self.w[...]

  mapping = infer_paths(Linen(), Port(nnx.Rngs(0)), jnp.ones((2, 4)))
  assert [(r.linen, r.nnx) for r in mapping.rules] == [('w', 'w')]


# -- inputs by keyword, as Flax's examples call their models ------------------


class KeywordTagger(nn.Module):
  @nn.compact
  def __call__(self, *, inputs, train: bool):
    x = nn.relu(nn.Dense(8, name='hidden')(nn.Embed(11, 8, name='embed')(inputs)))
    return nn.Dense(4, name='head')(nn.Dropout(0.5, deterministic=not train)(x))


class NNXKeywordTagger(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.embedder = nnx.Embed(11, 8, rngs=rngs)
    self.mlp = nnx.Linear(8, 8, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.out = nnx.Linear(8, 4, rngs=rngs)

  def __call__(self, *, inputs):
    return self.out(self.dropout(nnx.relu(self.mlp(self.embedder(inputs)))))


TAGGER_PAIRS = {('embed/embedding', 'embedder/embedding'), ('hidden/kernel', 'mlp/kernel'),
                ('hidden/bias', 'mlp/bias'), ('head/kernel', 'out/kernel'), ('head/bias', 'out/bias')}


@pytest.mark.parametrize('tokens', [jnp.zeros((2, 5), jnp.int32), jax.ShapeDtypeStruct((2, 5), jnp.int32)],
                         ids=['array', 'abstract'])
def test_keyword_inputs_of_a_linen_model_are_inputs_of_both_models(tokens):
  linen = LinenModel(KeywordTagger(), inputs=tokens, train=False)
  assert linen.keyword_inputs == {'inputs': tokens} and linen.settings == {'train': False}
  by_factories = infer_models(lambda: linen, lambda: NNXKeywordTagger(nnx.Rngs(0)))
  port = nnx.eval_shape(lambda: NNXKeywordTagger(nnx.Rngs(0)))
  port.eval()
  given_whole = infer_paths(linen, port)
  by_keyword = infer_paths(KeywordTagger(), port, inputs=tokens, linen_kwargs={'train': False})
  for mapping in (by_factories, given_whole, by_keyword):
    assert {(r.linen, r.nnx) for r in mapping.rules} == TAGGER_PAIRS


def test_example_inputs_given_in_a_linen_model_and_again_are_refused():
  tokens = jnp.zeros((2, 5), jnp.int32)
  with pytest.raises(PathMappingError, match='given twice'):
    infer_paths(LinenModel(KeywordTagger(), inputs=tokens, train=False),
                NNXKeywordTagger(nnx.Rngs(0)), inputs=tokens)


def test_a_failing_trace_says_how_to_give_arguments_in_the_terms_of_its_entry_point():
  tokens = jnp.zeros((2, 5), jnp.int32)
  port = NNXKeywordTagger(nnx.Rngs(0))
  with pytest.raises(PathMappingError, match='linen_kwargs=') as direct:
    infer_paths(KeywordTagger(), port, tokens, linen_kwargs={'train': False})
  with pytest.raises(PathMappingError, match=r'LinenModel\(module') as wrapped:
    infer_models(LinenModel(KeywordTagger(), tokens, train=False), port)
  assert 'linen_kwargs' not in str(wrapped.value) and 'LinenModel(' not in str(direct.value)


# -- given rules beside inference ---------------------------------------------


class TwoLayers(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(4, name='down')(nn.relu(nn.Dense(16, name='up')(x)))


class OutInLinear(nnx.Module):
  """A linear layer whose kernel is stored `(out, in)`."""

  def __init__(self, fan_in: int, fan_out: int, rngs: nnx.Rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (fan_out, fan_in)))
    self.b = nnx.Param(jnp.zeros((fan_out,)))

  def __call__(self, x):
    return x @ self.w[...].T + self.b[...]


class OutInLayers(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.first, self.second = OutInLinear(8, 16, rngs), OutInLinear(16, 4, rngs)

  def __call__(self, x):
    return self.second(nnx.relu(self.first(x)))


@pytest.mark.parametrize('spelling', ['i o -> o i', 'a b -> b a'])
def test_a_given_rule_wins_and_inference_fills_only_what_it_leaves(spelling):
  # Inference would write the first kernel's rule too, spelled 'a b -> b a'.
  given = PathRule('up/kernel', 'first/w', transform=Rearrange(spelling))
  x = jax.random.normal(jax.random.key(0), (2, 8))
  mapping = infer_paths(TwoLayers(), OutInLayers(nnx.Rngs(0)), x, paths=[given])
  assert [r for r in mapping.rules if r.linen == 'up/kernel'] == [given]
  assert len(set(mapping.rules)) == len(mapping.rules) == 4
  variables = TwoLayers().init(jax.random.key(1), x)
  port = linen_to_nnx(variables, target=OutInLayers(nnx.Rngs(0)), paths=mapping)
  np.testing.assert_allclose(np.asarray(port(x)), np.asarray(TwoLayers().apply(variables, x)), rtol=1e-6, atol=1e-6)


# -- forms two ports write alike, and where two programs part ----------------


class LearnedPositions(nn.Module):
  """Positions as a table sliced to the sequence (`pos[:L]`)."""

  @nn.compact
  def __call__(self, x):
    pos = self.param('pos', nn.initializers.normal(0.02), (16, 8))
    h = nn.Dense(8, name='fc')(x) + pos[:x.shape[1]]
    return nn.Dense(3, name='out')(h)


class EmbeddedPositions(nnx.Module):
  """The same positions as an `nnx.Embed` looked up at `arange(L)`, and a
  value computed and dropped (`self.fc(x).shape` traces the layer again)."""

  def __init__(self, rngs: nnx.Rngs):
    self.fc = nnx.Linear(4, 8, rngs=rngs)
    self.positions = nnx.Embed(16, 8, rngs=rngs)
    self.out = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    length = self.fc(x).shape[1]
    return self.out(self.fc(x) + self.positions(jnp.arange(length)))


def test_a_table_sliced_or_looked_up_at_a_range_and_dead_code_map_alike():
  x = jax.random.normal(jax.random.key(0), (2, 5, 4))
  mapping = infer_paths(LearnedPositions(), EmbeddedPositions(nnx.Rngs(0)), x)
  assert ('pos', 'positions/embedding') in {(r.linen, r.nnx) for r in mapping.rules}
  variables = LearnedPositions().init(jax.random.key(1), x)
  port = linen_to_nnx(variables, target=EmbeddedPositions(nnx.Rngs(0)), paths=mapping)
  np.testing.assert_array_equal(port(x), LearnedPositions().apply(variables, x))


class NoisyLinen(nn.Module):
  """Noise of its own on every call, eval mode included."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(8, name='fc')(x)
    return nn.Dense(3, name='out')(h + 0.1 * jax.random.normal(self.make_rng('noise'), h.shape))


class NoisyPort(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.fc, self.out, self.rngs = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 3, rngs=rngs), rngs

  def __call__(self, x):
    h = self.fc(x)
    return self.out(h + 0.1 * jax.random.normal(self.rngs.noise(), h.shape))


def test_a_stream_the_model_draws_itself_is_drawn_alike_on_both_sides():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  mapping = infer_paths(NoisyLinen(), NoisyPort(nnx.Rngs(0, noise=7)), x)
  assert {(r.linen, r.nnx) for r in mapping.rules} == {
      ('fc/kernel', 'fc/kernel'), ('fc/bias', 'fc/bias'), ('out/kernel', 'out/kernel'), ('out/bias', 'out/bias')}


class Elu(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3, name='out')(nn.elu(nn.Dense(8, name='fc')(x)))


class Gelu(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.fc, self.out = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.gelu(self.fc(x)))


def test_a_port_computing_otherwise_is_refused_naming_where_the_programs_part():
  with pytest.raises(PathMappingError) as info:
    infer_paths(Elu(), Gelu(nnx.Rngs(0)), jnp.ones((2, 4)))
  here = os.path.basename(__file__)
  found = re.search(r'part first at Linen `(\w+)` at (\S+):(\d+) \(Elu.__call__\) and NNX `(\w+)` at (\S+):(\d+) '
                    r'\(Gelu.__call__\)', str(info.value))
  assert found, str(info.value)
  assert os.path.basename(found[2]) == here and os.path.basename(found[5]) == here


def _sinusoid(length: int, width: int) -> jax.Array:
  position = jnp.arange(length)[:, None] / 10_000 ** (jnp.arange(width)[None, :] / width)
  return jnp.sin(position)


class SinusoidBlocks(nn.Module):
  """Positions computed in every block's call; or, `kept`, kept in each
  block's `constants` collection."""

  kept: bool = False

  @nn.compact
  def __call__(self, x):
    for i in range(2):
      if self.kept:
        table = self.variable('constants', f'pos_{i}', lambda: _sinusoid(6, 4)).value
      else:
        table = _sinusoid(6, 4)
      x = nn.Dense(4, name=f'block_{i}')(x + table[:x.shape[1]])
    return x


class TableBlock(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(4, 4, rngs=rngs)
    self.pos = nnx.Variable(_sinusoid(6, 4))  # read only: a constant of the port's own

  def __call__(self, x):
    return self.dense(x + self.pos[...][:x.shape[1]])


class TableBlocks(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.blocks = nnx.List([TableBlock(rngs) for _ in range(2)])

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x


def test_a_table_each_block_of_the_port_keeps_is_one_folded_rule():
  x = jax.random.normal(jax.random.key(0), (2, 5, 4))
  mapping = infer_paths(SinusoidBlocks(), TableBlocks(nnx.Rngs(0)), x)
  assert [r for r in mapping.rules if r.only] == [PathRule.nnx_only('blocks/{i}/pos')]
  with pytest.raises(PathMappingError, match=r"pass collections=\{'constants': nnx.Variable\}"):
    infer_paths(SinusoidBlocks(kept=True), TableBlocks(nnx.Rngs(0)), x)


class FlaxNorms(nn.Module):
  norm: str = 'rms'

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(8, name='fc')(x)
    h = nn.RMSNorm(name='norm')(h) if self.norm == 'rms' else nn.LayerNorm(name='norm')(h)
    return nn.Dense(3, name='out')(h)


class NormsByHand(nnx.Module):
  """The norms written out (`jnp.var`, `/ jnp.sqrt`, `lax.rsqrt`): the same
  function in other operations, so alike only within rounding."""

  def __init__(self, norm: str, rngs: nnx.Rngs):
    self.norm = norm
    self.up = nnx.Linear(4, 8, rngs=rngs)
    self.scale = nnx.Param(jnp.ones(8))
    self.shift = nnx.Param(jnp.zeros(8)) if norm == 'layer' else None
    self.down = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    h = self.up(x)
    if self.norm == 'rms':
      h = h * jax.lax.rsqrt(jnp.mean(h ** 2, -1, keepdims=True) + 1e-6) * self.scale[...]
    else:
      centred = h - jnp.mean(h, -1, keepdims=True)
      h = centred / jnp.sqrt(jnp.var(h, -1, keepdims=True) + 1e-6) * self.scale[...] + self.shift[...]
    return self.down(h)


@pytest.mark.parametrize('norm', ['rms', 'layer'])
def test_a_norm_written_by_hand_maps_onto_flaxs(norm):
  x = jax.random.normal(jax.random.key(0), (2, 4))
  mapping = infer_paths(FlaxNorms(norm), NormsByHand(norm, nnx.Rngs(0)), x)
  pairs = {(r.linen, r.nnx) for r in mapping.rules}
  assert ('norm/scale', 'scale') in pairs and ('fc/bias', 'up/bias') in pairs
  assert norm == 'rms' or ('norm/bias', 'shift') in pairs
  variables = FlaxNorms(norm).init(jax.random.key(1), x)
  port = linen_to_nnx(variables, target=NormsByHand(norm, nnx.Rngs(0)), paths=mapping)
  # Another order of float operations: equal within rounding, not bit for bit.
  np.testing.assert_allclose(port(x), FlaxNorms(norm).apply(variables, x), rtol=1e-5, atol=1e-6)


def test_a_norm_by_hand_that_names_its_scale_shift_maps_them_crossed():
  class Crossed(NormsByHand):
    def __call__(self, x):
      h = self.up(x)
      centred = h - jnp.mean(h, -1, keepdims=True)
      return self.down(centred / jnp.sqrt(jnp.var(h, -1, keepdims=True) + 1e-6) * self.shift[...] + self.scale[...])

  x = jax.random.normal(jax.random.key(0), (2, 4))
  mapping = infer_paths(FlaxNorms('layer'), Crossed('layer', nnx.Rngs(0)), x)
  pairs = {(r.linen, r.nnx) for r in mapping.rules}
  assert ('norm/scale', 'shift') in pairs and ('norm/bias', 'scale') in pairs
  variables = FlaxNorms('layer').init(jax.random.key(1), x)
  variables = jax.tree.map(lambda v: v + jax.random.uniform(jax.random.key(2), v.shape), variables)
  port = linen_to_nnx(variables, target=Crossed('layer', nnx.Rngs(0)), paths=mapping)
  np.testing.assert_allclose(port(x), FlaxNorms('layer').apply(variables, x), rtol=1e-5, atol=1e-6)


# -- parameters fused or split by the port -----------------------------------


class SeparateProjections(nn.Module):
  """Query, key and value as three `DenseGeneral`s (heads `(2, 4)`), as a
  vision transformer writes them."""

  @nn.compact
  def __call__(self, x):
    q, k, v = (nn.DenseGeneral((2, 4), name=name)(x) for name in ('query', 'key', 'value'))
    weights = jax.nn.softmax(jnp.einsum('bqnh,bknh->bnqk', q, k) / 2.0, axis=-1)
    return nn.DenseGeneral(8, axis=(-2, -1), name='out')(jnp.einsum('bnqk,bknh->bqnh', weights, v))


class FusedProjection(nnx.Module):
  """The port's one `Linear` for the three (`(8, 3 * 2 * 4)`), its output
  projection a `Linear` of the heads merged."""

  def __init__(self, rngs: nnx.Rngs):
    self.qkv = nnx.Linear(8, 24, rngs=rngs)
    self.out = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, x):
    b, length, _ = x.shape
    q, k, v = jnp.moveaxis(self.qkv(x).reshape(b, length, 3, 2, 4), 2, 0)
    weights = jax.nn.softmax(jnp.einsum('bqnh,bknh->bnqk', q, k) / 2.0, axis=-1)
    return self.out(jnp.einsum('bnqk,bknh->bqnh', weights, v).reshape(b, length, 8))


class GatedFeedForward(nn.Module):
  """A gate and an up projection in one kernel `(2, F, D)`, as Gemma writes it."""

  @nn.compact
  def __call__(self, x):
    gating = self.param('gating_einsum', nn.initializers.normal(0.2), (2, 12, 8))
    gate = jnp.einsum('...d,gfd->...gf', x, gating)
    return nn.gelu(gate[..., 0, :]) * gate[..., 1, :]


class GateAndUp(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.gate = nnx.Linear(8, 12, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(8, 12, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return nnx.gelu(self.gate(x)) * self.up(x)


@pytest.mark.parametrize('linen, port, expected', [
    # Nightly: CI infers q/k/v fused in every layer of the zoo's transformer
    # (test_query_key_value_fused_in_every_layer_are_inferred_as_the_hand_written_rules).
    pytest.param(SeparateProjections, FusedProjection, [
        PathRule(('query/kernel', 'key/kernel', 'value/kernel'), 'qkv/kernel',
                 transform=Rearrange('b c d -> b (parts c d)', c=2)),
        PathRule(('query/bias', 'key/bias', 'value/bias'), 'qkv/bias', transform=Rearrange('b c -> (parts b c)', b=2)),
    ], marks=pytest.mark.nightly),
    # Nightly: CI splits a kv einsum with its axes moved
    # (test_a_gemma_style_attention_splits_its_kv_einsum_where_four_projections_share_a_parts_size).
    pytest.param(GatedFeedForward, GateAndUp, [
        PathRule('gating_einsum', ('gate/kernel', 'up/kernel'), transform=Rearrange('parts b c -> c b')),
    ], marks=pytest.mark.nightly),
], ids=['fused', 'split'])
def test_parameters_fused_or_split_by_the_port_are_inferred_and_witnessed(linen, port, expected):
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  mapping = infer_paths(linen(), port(nnx.Rngs(0)), x)
  assert all(rule in mapping.rules for rule in expected), mapping.to_python()
  variables = linen().init(jax.random.key(1), x)
  ported = linen_to_nnx(variables, target=port(nnx.Rngs(0)), paths=mapping)
  # The fused product sums in another order than three separate ones: alike within rounding.
  np.testing.assert_allclose(ported(x), linen().apply(variables, x), rtol=1e-5, atol=1e-6)
  back = nnx_to_linen(ported, paths=mapping)
  jax.tree.map(np.testing.assert_array_equal, back['params'], variables['params'])


def _assert_gemma_style_split_and_merged(linen, port, fused_rules, offset: bool = False):
  """Inferred with no rule, the parts split from one einsum are `fused_rules`;
  converted through the mapping, the port computes what Linen does at the
  example's size and another, and comes back bit for bit. `offset` moves every
  variable off its initial value (a norm's scale off zero)."""
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  mapping = infer_paths(linen, port(), x)
  fused = {(r.linen, r.nnx) for r in mapping.rules if isinstance(r.nnx, tuple)}
  assert fused == fused_rules, mapping.to_python()
  variables = jax.jit(linen.init)(jax.random.key(1), x)  # (one program, not one an operation)
  if offset:
    variables = jax.tree.map(lambda v: v + jax.random.normal(jax.random.key(2), v.shape), variables)
  ported = linen_to_nnx(variables, target=port(), paths=mapping)
  # One einsum for key and value against two products: alike within rounding.
  run_port, run_linen = nnx.jit(lambda m, x: m(x)), jax.jit(linen.apply)
  for inputs in (x, jax.random.normal(jax.random.key(3), (3, 7, 8))):
    np.testing.assert_allclose(run_port(ported, inputs), run_linen(variables, inputs), rtol=1e-5, atol=1e-5)
  assert_trees_bit_equal(nnx_to_linen(ported, paths=mapping)['params'], variables['params'])


def test_a_gemma_style_attention_splits_its_kv_einsum_where_four_projections_share_a_parts_size():
  """The attention of the decoder below alone (CI's share of it): `q_proj`,
  `k_proj`, `v_proj` and `o_proj` are all `(D, D)`, as a `kv_einsum` part is;
  the witness takes the two the program uses where Linen uses the part."""
  _assert_gemma_style_split_and_merged(
      gemma_style.Attention(num_heads=2, num_kv_heads=2, features=8, head_dim=4),
      lambda: gemma_style.PortAttention(2, 2, 8, 4, nnx.Rngs(0)),
      {('kv_einsum/w', ('k_proj/kernel', 'v_proj/kernel'))},
  )


@pytest.mark.parametrize('layers, kv_heads', [
    # Nightly, some twenty-five seconds each: CI takes the attention alone (above).
    pytest.param(1, 2, marks=pytest.mark.nightly),  # four (D, D) projections beside a kv part (D, D)
    pytest.param(2, 1, marks=pytest.mark.nightly),  # grouped queries, in every layer of a loop
    pytest.param(2, 2, marks=pytest.mark.nightly),
], ids=['four-projections-of-a-part-size', 'grouped-queries-in-every-layer', 'four-projections-in-every-layer'])
def test_a_gemma_style_decoder_split_and_merged_as_hugging_face_writes_it_needs_no_rule(layers, kv_heads):
  """Key and value split from one einsum, gate and up too, heads merged,
  in every layer, with no rule given: where four `(D, D)` projections share
  a part's size, the run of two the program uses where Linen uses its
  `kv_einsum` is taken, the witness proving it."""
  layer = 'layer_{i}' if layers > 1 else 'layer_0'  # one rule for every layer
  nnx_layer = layer.replace('layer_', 'layers/')
  _assert_gemma_style_split_and_merged(
      gemma_style.Decoder(num_layers=layers, num_kv_heads=kv_heads),
      lambda: gemma_style.PortDecoder(num_layers=layers, num_kv_heads=kv_heads, rngs=nnx.Rngs(0)),
      {
          (f'{layer}/attn/kv_einsum/w', tuple(f'{nnx_layer}/self_attn/{p}_proj/kernel' for p in 'kv')),
          (f'{layer}/mlp/gating_einsum', tuple(f'{nnx_layer}/mlp/{p}_proj/kernel' for p in ('gate', 'up'))),
      },
      offset=True,  # the norms' scales off zero
  )


def test_a_fused_port_that_swaps_key_and_value_is_refused_where_it_splits_them():
  class Swapped(FusedProjection):
    def __call__(self, x):
      b, length, _ = x.shape
      q, v, k = jnp.moveaxis(self.qkv(x).reshape(b, length, 3, 2, 4), 2, 0)  # key and value swapped
      weights = jax.nn.softmax(jnp.einsum('bqnh,bknh->bnqk', q, k) / 2.0, axis=-1)
      return self.out(jnp.einsum('bnqk,bknh->bqnh', weights, v).reshape(b, length, 8))

  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  # Said under the fused layout that makes the structures agree, where the
  # two programs part: not as variables "used otherwise" at the attention.
  with pytest.raises(DisagreementError, match=(
      r"with the layouts that make the two structures agree \(PathRule\(\('query/.*"
      r"the models disagree.*part first at .* and NNX `\w+` at .*test_infer\.py")):
    infer_paths(SeparateProjections(), Swapped(nnx.Rngs(0)), x)


def test_fused_parts_no_run_can_see_are_refused_not_guessed():
  """Over one position, attention's softmax is 1 whatever the query and
  key: a port laying them out `(k, q, v)` agrees with the simplest layout
  there, and nowhere else. Refused, never that layout."""
  class KeyFirst(FusedProjection):
    def __call__(self, x):
      b, length, _ = x.shape
      k, q, v = jnp.moveaxis(self.qkv(x).reshape(b, length, 3, 2, 4), 2, 0)
      weights = jax.nn.softmax(jnp.einsum('bqnh,bknh->bnqk', q, k) / 2.0, axis=-1)
      return self.out(jnp.einsum('bnqk,bknh->bqnh', weights, v).reshape(b, length, 8))

  with pytest.raises(PathMappingError):
    infer_paths(SeparateProjections(), KeyFirst(nnx.Rngs(0)), jax.random.normal(jax.random.key(0), (2, 1, 8)))


class StackedExperts(nn.Module):
  """Three kernels in one parameter `(3, D, F)`, each read as `w[i]`."""

  @nn.compact
  def __call__(self, x):
    w = self.param('w', nn.initializers.normal(0.5), (3, 8, 6))
    return jnp.tanh(x @ w[0]) * (x @ w[1]) + jnp.sin(x @ w[2])


class ThreeLinears(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.a, self.b, self.c = (nnx.Linear(8, 6, use_bias=False, rngs=rngs) for _ in range(3))

  def __call__(self, x):
    return jnp.tanh(self.a(x)) * self.b(x) + jnp.sin(self.c(x))


def test_parts_stored_each_as_it_is_are_split_with_no_axis_moved():
  x = jax.random.normal(jax.random.key(0), (4, 8))
  mapping = infer_paths(StackedExperts(), ThreeLinears(nnx.Rngs(0)), x)
  assert mapping.rules == (
      PathRule('w', ('a/kernel', 'b/kernel', 'c/kernel'), transform=Rearrange('parts a b -> a b')),)
  variables = StackedExperts().init(jax.random.key(1), x)
  ported = linen_to_nnx(variables, target=ThreeLinears(nnx.Rngs(0)), paths=mapping)
  other = jax.random.normal(jax.random.key(2), (5, 8))
  np.testing.assert_array_equal(ported(other), StackedExperts().apply(variables, other))


@pytest.mark.nightly  # CI: test_a_port_that_computes_differently_is_refused_with_the_candidates, the fused refusals
def test_a_gemma_style_port_that_computes_otherwise_is_refused_not_split():
  class SiluMLP(gemma_style.PortMLP):
    def __call__(self, x):
      return self.down_proj(nnx.silu(self.gate_proj(x)) * self.up_proj(x))

  port = gemma_style.PortDecoder(num_layers=2, rngs=nnx.Rngs(0))
  for layer in port.layers:
    layer.mlp = SiluMLP(8, 12, nnx.Rngs(1))
  with pytest.raises(PathMappingError, match='do not compute with the same variables'):
    infer_paths(gemma_style.Decoder(num_layers=2), port, jax.random.normal(jax.random.key(0), (2, 5, 8)))
