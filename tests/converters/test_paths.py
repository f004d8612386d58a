"""Tests of `converters.paths`: rules, mappings, what they reject, and what `paths=None` means."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from converters.errors import PathMappingError
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

import converters
from converters import paths as path_mapping
from converters.paths import PathMapping, PathRule
from converters.presets import KIT_PATHS


def test_leading_zeros_are_not_layer_indices():
  assert not KIT_PATHS.match_all('linen', ('DotReluDot_01', 'W2'))


def test_user_rules_extend_a_preset():
  mapping = KIT_PATHS + [PathRule('Embed_0/embedding', 'embed/embedding')]
  (m,) = mapping.match_all('linen', ('Embed_0', 'embedding'))
  assert (m.layout, m.rule.path('nnx', m.layout, None)) == ('plain', ('embed', 'embedding'))


def test_match_lists_every_unmapped_and_ambiguous_path():
  mapping = KIT_PATHS + [PathRule('DotReluDot_3/W2', 'special/w2')]
  paths = [('DotReluDot_3', 'W2'), ('Head_0', 'kernel'), ('Head_0', 'bias'), ('DotReluDot_0', 'W2')]
  with pytest.raises(PathMappingError) as info:
    mapping.match('linen', paths)
  assert set(info.value.paths) == {
      'Head_0/kernel', 'Head_0/bias',
      "DotReluDot_3/W2 (rules: 'DotReluDot_{i}/W2'; 'DotReluDot_3/W2')",
  }


def test_describe_names_the_rule_of_a_path_or_says_that_none_does():
  fused = PathRule(('q/kernel', 'k/kernel'), 'qk/kernel', transform=converters.Rearrange('e h -> e (two h)'))
  mapping = KIT_PATHS + [fused]
  assert mapping.describe('nnx', ('layers', 2, 'w2')) == "rule 'DotReluDot_{i}/W2' <-> 'layers/{i}/w2'"
  assert mapping.describe('linen', ('ScanDotReluDot_0', 'W2')) == "rule 'ScanDotReluDot_0/W2' <-> 'layers/w2'"
  assert mapping.describe('linen', ('k', 'kernel')) == "rule 'q/kernel & k/kernel' <-> 'qk/kernel'"
  assert mapping.describe('nnx', ('head', 'kernel')) == 'no rule names it'
  kept = PathMapping(KIT_PATHS.rules, keep_unmatched=True)
  assert kept.describe('nnx', ('head', 'kernel')) == 'kept: no rule names it'


@pytest.mark.parametrize(
    'rule, message',
    [
        (dict(linen='A_{i}/w', nnx='a/w'), 'exactly once in every'),
        (dict(linen='A_{i}/w{i}', nnx='a/{i}/w'), 'exactly once in every'),
        (dict(linen='A/w', nnx='a/w', linen_stacked='S/w', nnx_stacked='s/w'), 'belong to layer rules'),
        (dict(linen=None, nnx='a/w', linen_stacked='S/w'), 'belong to layer rules'),
        (dict(linen=None, nnx=None, linen_stacked='S/w', nnx_stacked='s/w'), 'is a plain rule'),
        (dict(linen=None, nnx='a/{i}/w'), r'give the linen path .* its stacked path'),
        (dict(linen='A_{i}/w', nnx='a/{i}/w', linen_stacked='S_{i}/w', nnx_stacked='s/w'), 'have no {i}'),
        (dict(linen=('A_{i}/q', 'A_{i}/k'), nnx='a/{i}/qk', linen_stacked='S/q'), 'one template per'),
    ],
)
def test_malformed_rules_are_rejected(rule, message):
  with pytest.raises(PathMappingError, match=message):
    PathRule(**rule)


def test_a_rule_without_stacked_form_cannot_be_scanned():
  rule = PathRule('A_{i}/w', 'a/{i}/w')
  with pytest.raises(PathMappingError, match='no stacked form on the NNX side'):
    rule.path('nnx', 'scan', None)
  assert PathMapping([rule]).match_all('nnx', ('a', 3, 'w'))[0].index == 3


def test_each_side_has_the_forms_of_its_model():
  """A Linen model that scans beside a port that loops: the Linen side has
  only its stacked path, the NNX side only its looped template."""
  rule = PathRule(None, 'blocks/{i}/w', linen_stacked='ScanBlock_0/w')
  assert rule.layered and rule.layouts('linen') == ('scan',) and rule.layouts('nnx') == ('loop',)
  mapping = PathMapping([rule])
  (m,) = mapping.match_all('linen', ('ScanBlock_0', 'w'))
  assert (m.layout, m.rule.path('nnx', 'loop', 2)) == ('scan', ('blocks', 2, 'w'))
  assert not mapping.match_all('linen', ('Block_0', 'w'))
  assert rule.missing_form('nnx', 'scan') == 'its rule has no stacked form on the NNX side (nnx_stacked=None)'
  assert rule.missing_form('linen', 'loop') == 'its rule has no looped form on the Linen side (linen=None)'
  with pytest.raises(PathMappingError, match=r'no looped form on the Linen side .* give linen= \(with \{i\}\)'):
    rule.path('linen', 'loop', 0)
  namespace: dict = {}
  exec(mapping.to_python(), namespace)
  assert namespace['PATHS'] == mapping


# -- one-sided rules: state only one side has ---------------------------------------


def test_a_one_sided_rule_names_state_of_its_side_only():
  rule = PathRule.nnx_only('blocks/{i}/pos_table', nnx_stacked='blocks/pos_table')
  assert rule.only == 'nnx' and rule.layered
  assert rule.layouts('nnx') == ('loop', 'scan') and rule.layouts('linen') == ()
  mapping = PathMapping([PathRule('Dense_0/kernel', 'dense/kernel'), rule, PathRule.linen_only('consts/mask')])
  assert mapping.only('nnx', ('blocks', 3, 'pos_table')) and mapping.only('nnx', ('blocks', 'pos_table'))
  assert not mapping.only('nnx', ('dense', 'kernel')) and not mapping.only('linen', ('blocks', 'pos_table'))
  assert mapping.only('linen', ('consts', 'mask')) and not mapping.only('nnx', ('consts', 'mask'))
  assert mapping.describe('nnx', ('blocks', 0, 'pos_table')) == 'NNX only: kept from a target, left out of a source'
  assert mapping.describe('linen', ('consts', 'mask')) == 'Linen only: kept from a target, left out of a source'
  namespace: dict = {}
  exec(mapping.to_python(), namespace)
  assert namespace['PATHS'] == mapping
  assert "PathRule.nnx_only('blocks/{i}/pos_table', nnx_stacked='blocks/pos_table')" in mapping.to_python()


@pytest.mark.parametrize('rule, message', [
    # a missing side is refused, never read as "state only the other side has"
    (dict(linen=None, nnx='pos_table'), r"give the linen path .* write PathRule.nnx_only\('pos_table'\)"),
    (dict(linen='Embed_0/table', nnx=None), r"give the nnx path .* write PathRule.linen_only\('Embed_0/table'\)"),
    (dict(linen=None, nnx=None), 'give the linen path'),
    (dict(linen='a', nnx='b', only='nnx'), 'gives nnx templates and none of the other side'),
    (dict(linen=None, nnx=None, only='nnx'), 'gives nnx templates and none of the other side'),
    (dict(linen=None, nnx='b', only='both'), "only='both'"),
    (dict(linen=None, nnx='b', only='nnx', transform=converters.Rearrange('a b -> b a')), 'takes no transform'),
    (dict(linen=None, nnx=('pos_a', 'pos_b'), only='nnx'), r'names one path; write one PathRule.nnx_only\(\.\.\.\) per path'),
])
def test_malformed_one_sided_rules_are_refused(rule, message):
  with pytest.raises(PathMappingError, match=message):
    PathRule(**rule)


# -- keeping unmatched paths, and the default ----------------------------------------


def test_identity_keeps_every_path_with_list_indices_as_linen_strings():
  identity = PathMapping.identity()
  (m,) = identity.match_all('nnx', ('blocks', 3, 'attn', 'kernel'))
  assert m.layout == 'plain'
  assert m.rule.path('linen', 'plain', None) == ('blocks', '3', 'attn', 'kernel')
  (back,) = identity.match_all('linen', ('blocks', '3', 'attn', 'kernel'))
  assert back.rule.path('nnx', 'plain', None) == ('blocks', 3, 'attn', 'kernel')


def test_rules_take_precedence_over_kept_paths_and_addition_keeps_the_choice():
  mapping = PathMapping([PathRule('Dense_{i}/kernel', 'linears/{i}/kernel')], keep_unmatched=True)
  mapping += [PathRule('Embed_0/embedding', 'embed/embedding')]
  assert mapping.keep_unmatched
  renamed = mapping.match('linen', [('Dense_2', 'kernel'), ('Embed_0', 'embedding'), ('LayerNorm_0', 'scale')])
  assert {p: m.rule.path('nnx', m.layout, m.index) for p, m in renamed.items()} == {
      ('Dense_2', 'kernel'): ('linears', 2, 'kernel'),
      ('Embed_0', 'embedding'): ('embed', 'embedding'),
      ('LayerNorm_0', 'scale'): ('LayerNorm_0', 'scale'),
  }
  with pytest.raises(PathMappingError, match='no rule maps'):
    PathMapping(mapping.rules).match('linen', [('LayerNorm_0', 'scale')])


def test_keep_unmatched_must_be_a_bool():
  with pytest.raises(PathMappingError, match="keep_unmatched='yes'"):
    PathMapping([], keep_unmatched='yes')


def test_equal_mappings_compare_equal():
  rule = PathRule('A_{i}/w', 'a/{i}/w')
  assert PathMapping([rule]) == PathMapping((rule,))
  assert PathMapping([rule]) != PathMapping([rule], keep_unmatched=True)
  assert PathMapping.identity() == PathMapping([], keep_unmatched=True)


def test_an_omitted_mapping_is_the_identity_and_a_given_one_itself():
  assert path_mapping.resolve(None) == PathMapping.identity()
  assert path_mapping.resolve(KIT_PATHS) is KIT_PATHS


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(4, name='encoder')(x)
    return nn.LayerNorm(name='norm')(x)


class KeptNamesNet(nnx.Module):
  """An NNX port that kept the Linen names: nothing to map."""

  def __init__(self, rngs: nnx.Rngs):
    self.encoder = nnx.Linear(3, 4, rngs=rngs)
    self.norm = nnx.LayerNorm(4, rngs=rngs)

  def __call__(self, x):
    return self.norm(self.encoder(x))


def test_without_paths_a_port_that_kept_the_names_converts_both_ways_with_no_warning(recwarn):
  x = jnp.arange(6.0).reshape(2, 3)
  variables = LinenNet().init(jax.random.key(0), x)
  state = converters.linen_to_nnx(variables)
  model = KeptNamesNet(nnx.Rngs(1))
  nnx.update(model, state)
  np.testing.assert_array_equal(model(x), LinenNet().apply(variables, x))
  back = converters.nnx_to_linen(model)
  assert jax_tree_equal(back, variables)
  assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def jax_tree_equal(a, b) -> bool:
  same_structure = jax.tree.structure(a) == jax.tree.structure(b)
  return same_structure and all(
      np.asarray(x).tobytes() == np.asarray(y).tobytes()
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def test_kept_paths_keep_their_keys_whatever_characters_they_hold():
  identity = PathMapping.identity()
  (m,) = identity.match_all('linen', ('a/b', '01', '3', '²', '{i}x{i}'))
  assert m.rule.path('nnx', 'plain', None) == ('a/b', '01', 3, '²', '{i}x{i}')
  (back,) = identity.match_all('nnx', ('a/b', '01', 3, '²', '{i}x{i}'))
  assert back.rule.path('linen', 'plain', None) == ('a/b', '01', '3', '²', '{i}x{i}')
  with pytest.raises(PathMappingError, match="d/0: NNX key '0' is a string of digits"):
    identity.match_all('nnx', ('d', '0'))


# Keys as trees hold them: names with any characters (`/`, quotes,
# parentheses), NNX list indices, and tuple keys (Flax `SpectralNorm`).
_TEXT = st.text(alphabet=st.sampled_from("ab0/'\"()[], {}i_"), min_size=1, max_size=6)
_KEY = st.one_of(
    _TEXT.filter(lambda t: not t.isdigit()),
    st.integers(0, 99),
    st.tuples(_TEXT, _TEXT),
    st.tuples(st.integers(0, 9), _TEXT),
    st.tuples(), st.tuples(_TEXT),  # tuple keys of every length a literal has
)


@given(st.lists(_KEY, min_size=1, max_size=4))
def test_path_text_reads_back_as_the_path_it_was_written_from(path):
  path = tuple(path)
  assert path_mapping.parse_path(path_mapping.format_path(path), 'nnx') == path


def test_tuple_keys_and_keys_with_slashes_are_written_as_literals():
  path = ('sn', 'batch_stats', ('kernel', 'u'))
  assert path_mapping.format_path(path) == "sn/batch_stats/('kernel', 'u')"
  assert path_mapping.format_path(('SpectralNorm_0', 'Dense_0/kernel/u')) == (
      "SpectralNorm_0/'Dense_0/kernel/u'"
  )
  # Two different paths never read the same.
  assert path_mapping.format_path(('a', 'b')) != path_mapping.format_path(('a/b',))
  assert path_mapping.format_path((('a', 'b'),)) != path_mapping.format_path(("('a', 'b')",))


def test_a_literal_key_that_never_closes_is_refused():
  with pytest.raises(PathMappingError, match="opens a quoted or tuple key that never closes"):
    path_mapping.parse_path("a/'b/c", 'linen')


def test_rules_name_tuple_keyed_and_slashed_paths():
  mapping = PathMapping([
      PathRule("SpectralNorm_0/'Dense_0/kernel/u'", "sn/batch_stats/('kernel', 'u')"),
  ])
  (m,) = mapping.match_all('linen', ('SpectralNorm_0', 'Dense_0/kernel/u'))
  assert m.rule.path('nnx', 'plain', None) == ('sn', 'batch_stats', ('kernel', 'u'))
  (back,) = mapping.match_all('nnx', ('sn', 'batch_stats', ('kernel', 'u')))
  assert back.rule.path('linen', 'plain', None) == ('SpectralNorm_0', 'Dense_0/kernel/u')


def test_templates_take_one_spelling_so_that_any_spelling_matches():
  """A tuple or quoted key written with double quotes names the same path."""
  rule = PathRule('SpectralNorm_0/"Dense_0/kernel/u"', 'sn/batch_stats/("kernel", "u")')
  assert (rule.linen, rule.nnx) == ("SpectralNorm_0/'Dense_0/kernel/u'", "sn/batch_stats/('kernel', 'u')")
  mapping = PathMapping([rule])
  assert mapping.match_all('nnx', ('sn', 'batch_stats', ('kernel', 'u')))
  assert mapping.match_all('linen', ('SpectralNorm_0', 'Dense_0/kernel/u'))
  with pytest.raises(PathMappingError, match='never closes'):
    PathRule("a/'b", 'a/b')


def test_an_empty_tuple_key_reads_back():
  path = ('a', (), 'b')
  assert path_mapping.parse_path(path_mapping.format_path(path), 'nnx') == path


def test_scan_and_num_layers_without_layer_rules_are_refused_not_ignored():
  params = {'params': {'Block_0': {'w': jnp.ones(2)}, 'Block_1': {'w': jnp.ones(2)}}}
  with pytest.raises(converters.LayoutError, match=r'scan=True: no PathRule of the mapping has layers'):
    converters.relayout(params, scan=True)
  with pytest.raises(converters.LayoutError, match=r'num_layers=7: no PathRule'):
    converters.linen_to_nnx(params, num_layers=7)


def test_an_omitted_mapping_keeps_every_collections_paths():
  from tests.converters.conversion_cases import description, linen_trained

  params = linen_trained(description('device', False), 'adam', 0).params
  variables = {'params': params, 'cache': {'DotReluDot_0': {'index': jnp.zeros((), jnp.int32)}}}
  state = converters.linen_to_nnx(variables)
  assert set(state) == set(params)
  assert state['DotReluDot_0']['index'].get_value() == 0
  assert state['DotReluDot_0']['W2'].get_value() is params['DotReluDot_0']['W2'].value




# --- layers Linen numbers around a loop's: `Dense_{i+1}`, `Dense_{n}`


def _numbered_around_a_loop() -> PathMapping:
  return PathMapping([
      PathRule('Dense_0/kernel', 'proj/kernel'),
      PathRule('Dense_{i+1}/kernel', 'denses/{i}/kernel', linen_stacked='Scan_0/kernel'),
      PathRule('Dense_{n}/kernel', 'head/kernel'),
      PathRule('Dense_{n+1}/kernel', 'out/kernel'),
  ])


@given(st.integers(0, 12))
def test_layers_numbered_around_a_loop_map_both_ways_at_any_length(length):
  mapping = _numbered_around_a_loop()
  linen = [(f'Dense_{k}', 'kernel') for k in range(length + 3)]
  nnx = [('proj', 'kernel'), *((('denses', k, 'kernel')) for k in range(length)), ('head', 'kernel'), ('out', 'kernel')]
  # The k-th Linen Dense is the k-th NNX layer in the order the port makes them.
  to_nnx = {p: m.rule.path('nnx', m.layout, m.index) for p, m in mapping.match('linen', linen).items()}
  assert [to_nnx[p] for p in linen] == nnx
  to_linen = {p: m.rule.path('linen', m.layout, m.index) for p, m in mapping.match('nnx', nnx).items()}
  assert [to_linen[p] for p in nnx] == linen
  # Bound to either side's paths, the mapping is the same.
  assert mapping.bound('linen', linen) == mapping.bound('nnx', nnx)


def test_an_unbound_counted_rule_names_nothing_and_the_written_form_reads_back():
  mapping = _numbered_around_a_loop()
  assert not mapping.match_all('nnx', ('head', 'kernel'))
  namespace = {}
  exec(mapping.to_python('PATHS'), namespace)
  assert namespace['PATHS'] == mapping


class _HeadAfterLoop(nn.Module):
  widths: tuple = (4, 4)

  @nn.compact
  def __call__(self, x):
    for width in self.widths:
      x = nn.Dense(width)(x)
    return nn.Dense(2)(x)


class _HeadAfterLoopPort(nnx.Module):
  def __init__(self, widths, in_features, rngs):
    self.denses = nnx.List()
    for width in widths:
      self.denses.append(nnx.Linear(in_features, width, rngs=rngs))
      in_features = width
    self.head = nnx.Linear(in_features, 2, rngs=rngs)

  def __call__(self, x):
    for dense in self.denses:
      x = dense(x)
    return self.head(x)


_HEAD_PATHS = PathMapping([
    PathRule('Dense_{i}/kernel', 'denses/{i}/kernel'), PathRule('Dense_{i}/bias', 'denses/{i}/bias'),
    PathRule('Dense_{n}/kernel', 'head/kernel'), PathRule('Dense_{n}/bias', 'head/bias'),
])


@pytest.mark.parametrize('widths', [(), (4,), (4, 5, 6)])
def test_a_counted_mapping_converts_both_ways_by_outputs(widths):
  x = jax.random.normal(jax.random.key(1), (3, 3))
  variables = _HeadAfterLoop(widths).init(jax.random.key(0), x)
  model = converters.linen_to_nnx(variables, target=_HeadAfterLoopPort(widths, 3, nnx.Rngs(0)), paths=_HEAD_PATHS)
  np.testing.assert_array_equal(model(x), _HeadAfterLoop(widths).apply(variables, x))
  back = converters.nnx_to_linen(model, paths=_HEAD_PATHS)
  jax.tree.map(np.testing.assert_array_equal, dict(back['params']), dict(variables['params']))


def test_a_checkpoint_of_another_length_is_refused_not_shifted():
  # Three Linen Dense for a port of one looped layer and the head: the head
  # would be read as the loop's second layer; the target's shapes refuse it.
  variables = _HeadAfterLoop((4, 4)).init(jax.random.key(0), jnp.ones((3, 3)))
  with pytest.raises(converters.ConversionError):
    converters.linen_to_nnx(variables, target=_HeadAfterLoopPort((4,), 3, nnx.Rngs(0)), paths=_HEAD_PATHS)


@pytest.mark.parametrize('rule, message', [
    (lambda: PathRule('Dense_{n}/kernel', 'head_{n}/kernel'), 'nnx cannot hold it'),
    (lambda: PathRule('Dense_{n}/kernel', 'head/kernel', linen_stacked='S/kernel'), 'stacked templates belong to layer rules'),
    (lambda: PathRule('Block_{i}/Dense_{n}/kernel', 'blocks/{i}/head/kernel'), 'without {i}'),
    (lambda: PathMapping([PathRule('Dense_{n}/kernel', 'head/kernel')]), 'a loop no rule names'),
])
def test_a_counted_key_is_refused_where_it_numbers_nothing(rule, message):
  with pytest.raises(PathMappingError, match=re.escape(message)):
    rule()


def test_loop_rules_of_one_key_with_different_first_numbers_are_refused_when_bound():
  mapping = PathMapping([
      PathRule('Dense_{i}/kernel', 'denses/{i}/kernel'),
      PathRule('Dense_{i+1}/bias', 'denses/{i}/bias'),
      PathRule('Dense_{n}/kernel', 'head/kernel'),
  ])
  with pytest.raises(PathMappingError, match='number the loop'):
    mapping.match('linen', [('Dense_0', 'kernel'), ('Dense_1', 'kernel')])


class _NormsAfterLoop(nn.Module):
  """The loop's norms hold a scale and bias, the last norm statistics alone."""

  widths: tuple = (4, 4)

  @nn.compact
  def __call__(self, x, train: bool = False):
    for width in self.widths:
      x = nn.BatchNorm(use_running_average=not train)(nn.Dense(width)(x))
    return nn.BatchNorm(use_running_average=not train, use_scale=False, use_bias=False)(nn.Dense(4)(x))


class _NormsAfterLoopPort(nnx.Module):
  def __init__(self, widths, in_features, rngs):
    self.denses, self.norms = nnx.List(), nnx.List()
    for width in widths:
      self.denses.append(nnx.Linear(in_features, width, rngs=rngs))
      self.norms.append(nnx.BatchNorm(width, rngs=rngs))
      in_features = width
    self.dense = nnx.Linear(in_features, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, use_scale=False, use_bias=False, rngs=rngs)

  def __call__(self, x):
    for dense, norm in zip(self.denses, self.norms):
      x = norm(dense(x))
    return self.norm(self.dense(x))


_NORM_PATHS = PathMapping([
    *(PathRule(f'Dense_{{i}}/{v}', f'denses/{{i}}/{v}') for v in ('kernel', 'bias')),
    *(PathRule(f'Dense_{{n}}/{v}', f'dense/{v}') for v in ('kernel', 'bias')),
    *(PathRule(f'BatchNorm_{{i}}/{v}', f'norms/{{i}}/{v}') for v in ('scale', 'bias', 'mean', 'var')),
    *(PathRule(f'BatchNorm_{{n}}/{v}', f'norm/{v}') for v in ('mean', 'var')),
])


@pytest.mark.parametrize('widths', [(), (4,), (4, 5, 3)])
def test_a_loop_length_is_the_models_in_every_collection_and_either_way(widths):
  # The parameters alone tell no length (the last norm has none): bound
  # over every collection, or the target's, each layer goes where it is.
  x = jax.random.normal(jax.random.key(1), (3, 3))
  variables = _NormsAfterLoop(widths).init(jax.random.key(0), x)
  variables = {'params': variables['params'], 'batch_stats': jax.tree.map(
      lambda v: v + jax.random.uniform(jax.random.key(2), v.shape), variables['batch_stats'])}
  model = converters.linen_to_nnx(variables, target=_NormsAfterLoopPort(widths, 3, nnx.Rngs(0)), paths=_NORM_PATHS)
  model.eval()
  np.testing.assert_array_equal(model(x), _NormsAfterLoop(widths).apply(variables, x))
  # Back without a target, and the parameters alone (their gradients, say).
  back = converters.nnx_to_linen(model, paths=_NORM_PATHS)
  jax.tree.map(np.testing.assert_array_equal, back, variables)
  only_params = converters.linen_to_nnx({'params': variables['params']}, paths=_NORM_PATHS)
  assert {p[:2] for p, _ in nnx.to_flat_state(only_params)} >= {('norms', k) for k in range(len(widths))}


def test_a_stacked_port_converts_back_to_a_loop_and_a_counted_head():
  mapping = PathMapping([
      PathRule('Dense_{i}/kernel', 'denses/{i}/kernel', nnx_stacked='stack/kernel'),
      PathRule('Dense_{n}/kernel', 'head/kernel'),
  ])
  linen = {'params': {f'Dense_{k}': {'kernel': jnp.full((2, 2), float(k))} for k in range(4)}}
  stacked = converters.linen_to_nnx(linen, paths=mapping, scan=True)
  np.testing.assert_array_equal(stacked['stack']['kernel'][...], jnp.stack([jnp.full((2, 2), float(k)) for k in range(3)]))
  back = converters.nnx_to_linen(stacked, paths=mapping, scan=False)
  assert {k: float(v['kernel'][0, 0]) for k, v in back['params'].items()} == {f'Dense_{k}': float(k) for k in range(4)}


def test_a_bound_mapping_keeps_its_rules_and_compares_by_its_binding():
  mapping = _numbered_around_a_loop()
  three = mapping.bound('linen', [(f'Dense_{k}', 'kernel') for k in range(5)])
  one = mapping.bound('linen', [(f'Dense_{k}', 'kernel') for k in range(3)])
  assert three.rules == one.rules == mapping.rules  # written back as given
  assert three != one and three != mapping and three.bound('linen', [(f'Dense_{k}', 'kernel') for k in range(5)]) == three
  assert (three + []) == mapping  # a new mapping: unbound


@pytest.mark.parametrize('template', ['Dense_{n+0}/kernel', 'Dense_{n-1}/kernel', 'Dense_{ n }/kernel', 'Dense_{i+0}/kernel'])
def test_a_brace_that_is_no_index_is_refused(template):
  with pytest.raises(PathMappingError, match='is no index'):
    PathRule(template, 'head/kernel')


def test_inference_keeps_a_given_counted_rule_as_given():
  x = jax.random.normal(jax.random.key(1), (3, 3))
  widths = (4, 5, 6)
  found = converters.infer_paths(_HeadAfterLoop(widths), _HeadAfterLoopPort(widths, 3, nnx.Rngs(0)), x, paths=_HEAD_PATHS)
  assert set(_HEAD_PATHS.rules) <= set(found.rules)
  # And it converts another length.
  variables = _HeadAfterLoop((4,)).init(jax.random.key(0), x)
  model = converters.linen_to_nnx(variables, target=_HeadAfterLoopPort((4,), 3, nnx.Rngs(0)), paths=found)
  np.testing.assert_array_equal(model(x), _HeadAfterLoop((4,)).apply(variables, x))
