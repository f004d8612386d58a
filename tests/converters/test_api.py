"""Tests of `converters.api`: conversions are exact, zero-copy and never mutate."""

from __future__ import annotations

import collections
import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from hypothesis import example, given
from hypothesis import strategies as st

import converters
from converters.presets import KIT_PATHS
from kit_mlp.description import FSDP_RULES
from kit_mlp.optimizers import OPTIMIZERS
from nnx_port.constrained_params import ConstrainedParam
from tests.converters.conversion_cases import (
    STEPS,
    batches,
    copy as copy_tree,
    description,
    linen_trained,
    linen_trainer,
    nnx_abstract,
    nnx_arrays,
    nnx_trained,
    nnx_trainer,
)
from tests.helpers import assert_trees_bit_equal

LAYOUTS = [(False, False), (True, True), (True, False), (False, True)]
K = 2  # steps before the conversion; STEPS - K after it


def layout_id(layouts):
  return '->'.join('scan' if s else 'loop' for s in layouts)


def boxes(tree):
  return [
      (jax.tree_util.keystr(p), type(x).__name__, x.names, getattr(x, 'rules', None))
      for p, x in jax.tree_util.tree_flatten_with_path(
          tree, is_leaf=lambda x: isinstance(x, nn.Partitioned)
      )[0]
  ]


def assert_same_shardings(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.sharding.is_equivalent_to(y.sharding, x.ndim), (x.sharding, y.sharding)


@pytest.mark.parametrize('optimizer', OPTIMIZERS)
@pytest.mark.parametrize('annotation', ['device', 'logical'])
@pytest.mark.parametrize('layouts', LAYOUTS, ids=layout_id)
def test_linen_k_steps_then_nnx_j_steps_equal_linen_k_plus_j(layouts, annotation, optimizer):
  linen_scan, nnx_scan = layouts
  linen_desc = description(annotation, linen_scan)
  nnx_desc = description(annotation, nnx_scan)
  xs, ys = batches(linen_desc)
  state = linen_trained(linen_desc, optimizer, K)
  model, opt = converters.linen_to_nnx(
      copy_tree(state), target=nnx_abstract(nnx_desc, optimizer),
      scan=nnx_scan, layer_partition=nnx_desc.layer_partition,
      paths=KIT_PATHS,
  )
  trainer = nnx_trainer(nnx_desc, optimizer)
  with jax.set_mesh(trainer.mesh):
    arrays, nnx_losses = trainer.train_steps(nnx_arrays(model, opt), xs[K:], ys[K:])
    reference, linen_losses = linen_trainer(linen_desc, optimizer).train_steps(
        state, xs[K:], ys[K:]
    )
  assert_trees_bit_equal(nnx_losses, linen_losses)
  back = converters.nnx_to_linen(
      trainer.merge(arrays), target=linen_trainer(linen_desc, optimizer).abstract_state,
      scan=linen_scan, layer_partition=linen_desc.layer_partition,
      paths=KIT_PATHS,
  )
  assert_trees_bit_equal(back, reference)
  assert int(back.step) == STEPS


def each_side_in_its_layout(linen_scan: bool) -> converters.PathMapping:
  """KIT_PATHS as a mapping of models that each have one layout: the Linen
  side's templates of its layout only, the NNX side's of the other."""
  return converters.PathMapping([
      converters.PathRule(
          None if linen_scan else r.linen, r.nnx if linen_scan else None,
          linen_stacked=r.linen_stacked if linen_scan else None,
          nnx_stacked=None if linen_scan else r.nnx_stacked,
      ) if r.layered else r
      for r in KIT_PATHS.rules
  ])


@pytest.mark.parametrize('layouts', LAYOUTS[2:], ids=layout_id)
def test_a_mapping_with_one_layout_per_side_converts_training_states_across_layouts(layouts):
  linen_scan, nnx_scan = layouts
  linen_desc, nnx_desc = description('device', linen_scan), description('device', nnx_scan)
  state = linen_trained(linen_desc, 'adam', K)
  mapping = each_side_in_its_layout(linen_scan)
  convert = lambda paths: converters.linen_to_nnx(
      copy_tree(state), target=nnx_abstract(nnx_desc, 'adam'), scan=nnx_scan,
      layer_partition=nnx_desc.layer_partition, paths=paths,
  )
  model, opt = convert(mapping)
  assert_trees_bit_equal(nnx_arrays(model, opt), nnx_arrays(*convert(KIT_PATHS)))
  # Without scan=, each parameter takes the one layout its rule's target side has.
  back = converters.nnx_to_linen(
      (model, opt), target=linen_trainer(linen_desc, 'adam').abstract_state,
      layer_partition=linen_desc.layer_partition, paths=mapping,
  )
  assert_trees_bit_equal(back, state)
  with pytest.raises(converters.LayoutError, match='no (stacked|looped) form on the NNX side'):
    converters.linen_to_nnx({'params': state.params}, scan=linen_scan, paths=mapping)


@pytest.mark.parametrize('optimizer', ['adam', 'fsdp_sgd'])
@pytest.mark.parametrize('layouts', LAYOUTS, ids=layout_id)
def test_nnx_k_steps_then_linen_j_steps_equal_nnx_k_plus_j(layouts, optimizer):
  nnx_scan, linen_scan = layouts
  nnx_desc = description('logical', nnx_scan, rules=FSDP_RULES)
  linen_desc = description('logical', linen_scan, rules=FSDP_RULES)
  xs, ys = batches(nnx_desc)
  model, opt = nnx_trained(nnx_desc, optimizer, K)
  linen = linen_trainer(linen_desc, optimizer)
  state = converters.nnx_to_linen(
      (model, opt), target=linen.abstract_state,
      scan=linen_scan, layer_partition=linen_desc.layer_partition,
      paths=KIT_PATHS,
  )
  trainer = nnx_trainer(nnx_desc, optimizer)
  with jax.set_mesh(trainer.mesh):
    state = copy_tree(state)  # training donates; keep `model` alive
    state, linen_losses = linen.train_steps(state, xs[K:], ys[K:])
    reference, nnx_losses = trainer.train_steps(copy_tree(nnx_arrays(model, opt)), xs[K:], ys[K:])
  assert_trees_bit_equal(linen_losses, nnx_losses)
  # Parameters, every optimizer moment and the step, as NNX alone got them.
  expected = converters.nnx_to_linen(
      trainer.merge(reference), target=linen.abstract_state,
      scan=linen_scan, layer_partition=linen_desc.layer_partition,
      paths=KIT_PATHS,
  )
  assert_trees_bit_equal(state, expected)
  assert int(state.step) == STEPS


@pytest.mark.parametrize('annotation', ['device', 'logical'])
@pytest.mark.parametrize('use_scan', [False, True])
def test_same_layout_conversion_copies_no_array(annotation, use_scan):
  desc = description(annotation, use_scan)
  state = linen_trained(desc, 'adam', 1)
  model, opt = converters.linen_to_nnx(state, target=nnx_abstract(desc, 'adam'), paths=KIT_PATHS)
  by_id = {id(x) for x in jax.tree.leaves(state)}
  converted = jax.tree.leaves(nnx_arrays(model, opt))
  # Everything but the step (int32 in Linen, uint32 in NNX) is the input buffer.
  assert sum(id(x) not in by_id for x in converted) == 1
  back = converters.nnx_to_linen((model, opt), target=linen_trainer(desc, 'adam').abstract_state, paths=KIT_PATHS)
  assert {id(x) for x in jax.tree.leaves(back.params)} <= by_id
  assert {id(x) for x in jax.tree.leaves(back.opt_state)} <= by_id


@pytest.mark.parametrize('layouts', LAYOUTS[2:], ids=layout_id)
def test_relayout_stays_on_device_and_shards_as_annotated(layouts):
  source_scan, target_scan = layouts
  desc = description('logical', source_scan, rules=FSDP_RULES)
  state = linen_trained(desc, 'adam', 1)
  with jax.transfer_guard('disallow'):
    out = converters.linen_to_nnx(
        {'params': state.params}, scan=target_scan, layer_partition='layer', paths=KIT_PATHS
    )
  target_desc = description('logical', target_scan, rules=FSDP_RULES)
  mesh = desc.make_mesh()
  with jax.set_mesh(mesh):
    specs = nnx.get_partition_spec(out)
  for (path, var), (_, spec) in zip(nnx.to_flat_state(out), nnx.to_flat_state(specs)):
    array = var[...]
    want = jax.sharding.NamedSharding(mesh, spec.get_value())
    assert array.sharding.is_equivalent_to(want, array.ndim), path
  expected = nnx.state(nnx_abstract(target_desc, 'adam')[0])
  assert [p for p, _ in nnx.to_flat_state(out)] == [p for p, _ in nnx.to_flat_state(expected)]
  for (_, got), (_, want) in zip(nnx.to_flat_state(out), nnx.to_flat_state(expected)):
    assert got.get_metadata()['out_sharding'] == want.get_metadata()['out_sharding']
    assert got.shape == want.shape


def with_negative_zero(params):
  """`params` with one element of its first array set to -0.0: a value training
  can leave that `==` cannot tell from 0.0, only bits can."""
  flat, tree = jax.tree.flatten(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  first = flat[0]
  value = jax.device_put(first.value.at[(0,) * first.value.ndim].set(-0.0), first.value.sharding)
  return jax.tree.unflatten(tree, [first.replace(value=value)] + flat[1:])


@pytest.mark.parametrize('annotation', ['device', 'logical'])
def test_round_trips_are_the_identity(annotation):
  for use_scan in (False, True):
    desc = description(annotation, use_scan)
    variables = {'params': with_negative_zero(linen_trained(desc, 'adam', 0).params)}
    before = boxes(variables)
    for layout in (not use_scan, use_scan):  # through the other layout, and back
      nnx_state = converters.linen_to_nnx(variables, scan=layout, layer_partition=desc.layer_partition, paths=KIT_PATHS)
      again = converters.nnx_to_linen(nnx_state, scan=use_scan, layer_partition=desc.layer_partition, paths=KIT_PATHS)
      assert boxes(again) == before
      assert_trees_bit_equal(again, variables)
      assert_same_shardings(again, variables)
    # nnx -> linen -> nnx
    model, _ = nnx_trained(desc, 'adam', 0)
    state = nnx.state(model)
    linen = converters.nnx_to_linen(state, scan=not use_scan, layer_partition=desc.layer_partition, paths=KIT_PATHS)
    again = converters.linen_to_nnx(linen, scan=use_scan, layer_partition=desc.layer_partition, paths=KIT_PATHS)
    assert_trees_bit_equal(nnx.to_pure_dict(again), nnx.to_pure_dict(state))
    for (p, a), (_, b) in zip(nnx.to_flat_state(again), nnx.to_flat_state(state)):
      assert a.get_metadata() == b.get_metadata(), p
      # Without a target, plain Params, which `nnx.update` puts into the
      # model's own (here constrained) parameters.
      assert type(a) is nnx.Param and isinstance(b, nnx.Param), p
    nnx.update(model, again)
    assert {type(v) for _, v in nnx.to_flat_state(nnx.state(model))} == {ConstrainedParam}


@pytest.mark.parametrize('layouts', LAYOUTS, ids=layout_id)
def test_donate_deletes_exactly_the_relaid_sources_and_changes_no_result(layouts):
  source_scan, target_scan = layouts
  relaid = source_scan != target_scan
  desc = description('logical', source_scan)
  target = nnx_abstract(description('logical', target_scan), 'adam')
  original = linen_trained(desc, 'adam', 1)
  options = {'layer_partition': description('logical', True).layer_partition, 'paths': KIT_PATHS}
  expected = nnx_arrays(*converters.linen_to_nnx(original, target=target, scan=target_scan, **options))
  state = copy_tree(original)
  model, opt = converters.linen_to_nnx(state, target=target, scan=target_scan, donate=True, **options)
  assert_trees_bit_equal(nnx_arrays(model, opt), expected)
  moments = [state.params, state.opt_state[0].mu, state.opt_state[0].nu]
  assert all(x.is_deleted() == relaid for x in jax.tree.leaves(moments))
  assert not state.step.is_deleted() and not state.opt_state[0].count.is_deleted()

  back = converters.nnx_to_linen(
      (model, opt), target=linen_trainer(desc, 'adam').abstract_state,
      scan=source_scan, donate=True, **options,
  )
  assert_trees_bit_equal(back.params, original.params)
  assert_trees_bit_equal(back.opt_state, original.opt_state)
  assert all(x.is_deleted() == relaid for x in jax.tree.leaves(nnx.state(model)))


def test_inputs_are_never_mutated():
  desc = description('logical', True)
  state = linen_trained(desc, 'adam', 1)
  is_box = lambda x: isinstance(x, nn.Partitioned)
  linen_meta = [copy.copy(vars(b)) for b in jax.tree.leaves(state, is_leaf=is_box) if is_box(b)]
  assert len(linen_meta) == 6 and all('names' in m for m in linen_meta)
  looped = description('logical', False)
  model, opt = converters.linen_to_nnx(state, target=nnx_abstract(looped, 'adam'), scan=False, paths=KIT_PATHS)
  after = [vars(b) for b in jax.tree.leaves(state, is_leaf=is_box) if is_box(b)]
  assert [set(m) for m in after] == [set(m) for m in linen_meta]
  assert [(m['names'], m['rules']) for m in after] == [(m['names'], m['rules']) for m in linen_meta]
  nnx_meta = [v.get_metadata() for _, v in nnx.to_flat_state(nnx.state((model, opt)))]
  converters.nnx_to_linen(
      (model, opt), target=linen_trainer(desc, 'adam').abstract_state,
      scan=True, layer_partition='layer',
      paths=KIT_PATHS,
  )
  assert [v.get_metadata() for _, v in nnx.to_flat_state(nnx.state((model, opt)))] == nnx_meta


def test_flax_to_nnx_metadata_defect_is_real():
  # The reason `metadata.read_linen` copies boxes: this is what it guards against.
  box = nn.LogicallyPartitioned(jnp.zeros((2,)), ('embed',), rules=(('embed', None),))
  box.to_nnx_metadata()
  assert 'names' not in vars(box)


def test_unknown_nnx_metadata_is_carried_through_linen_and_back():
  desc = description('device', False)
  model, _ = nnx_trained(desc, 'adam', 0)
  state = nnx.state(model)
  kernel = state['layers'][0]['dot1']['kernel']
  kernel.set_metadata(owner='team-a', eager_sharding=False)
  linen = converters.nnx_to_linen(state, paths=KIT_PATHS)
  box = linen['params']['DotReluDot_0']['Dense_0']['kernel']
  assert isinstance(box, nn.Partitioned) and box.names == (None, 'model')
  with jax.set_mesh(desc.make_mesh()):
    assert linen_trainer(desc, 'adam').apply(linen['params'], batches(desc)[0][0]).shape == (8, 64)
  back = converters.linen_to_nnx(linen, paths=KIT_PATHS)
  got = back['layers'][0]['dot1']['kernel'].get_metadata()
  assert got['owner'] == 'team-a' and got['eager_sharding'] is False
  assert got == kernel.get_metadata()


@pytest.mark.parametrize('annotation', ['device', 'logical'])
def test_relayout_within_each_framework_keeps_outputs(annotation):
  scanned, looped = description(annotation, True), description(annotation, False)
  variables = {'params': linen_trained(scanned, 'adam', 0).params}
  as_loop = converters.relayout(variables, scan=False, paths=KIT_PATHS)
  assert boxes(as_loop) == boxes({'params': linen_trained(looped, 'adam', 0).params})
  x = batches(scanned)[0][0]
  with jax.set_mesh(scanned.make_mesh()):
    y_scan = linen_trainer(scanned, 'adam').apply(variables['params'], x)
    y_loop = linen_trainer(looped, 'adam').apply(as_loop['params'], x)
  assert_trees_bit_equal(y_loop, y_scan)
  again = converters.relayout(as_loop, scan=True, layer_partition=scanned.layer_partition, paths=KIT_PATHS)
  assert boxes(again) == boxes(variables)
  assert_trees_bit_equal(again, variables)

  state = nnx.state(nnx_trained(looped, 'adam', 0)[0])
  stacked = converters.relayout(state, scan=True, layer_partition=scanned.layer_partition, paths=KIT_PATHS)
  expected = nnx.state(nnx_abstract(scanned, 'adam')[0])
  for (p, got), (q, want) in zip(nnx.to_flat_state(stacked), nnx.to_flat_state(expected)):
    assert p == q and got.shape == want.shape
    assert got.get_metadata()['out_sharding'] == want.get_metadata()['out_sharding']
  assert_trees_bit_equal(
      nnx.to_pure_dict(converters.relayout(stacked, scan=False, paths=KIT_PATHS)), nnx.to_pure_dict(state)
  )


def test_nnx_update_accepts_converted_params_and_outputs_match():
  desc = description('logical', True, rules=FSDP_RULES)
  variables = {'params': linen_trained(desc, 'adam', 1).params}
  model, _ = nnx_trained(desc, 'adam', 0)
  nnx.update(model, converters.linen_to_nnx(copy_tree(variables), paths=KIT_PATHS))
  x = batches(desc)[0][0]
  with jax.set_mesh(desc.make_mesh()):
    y_linen = linen_trainer(desc, 'adam').apply(variables['params'], x)
    y_nnx = nnx.jit(lambda m, x: m(x))(model, x)
  assert_trees_bit_equal(y_nnx, y_linen)
  assert y_nnx.sharding.is_equivalent_to(y_linen.sharding, 2)


# -- donation never frees what something else still uses -----------------------------


def tied_params(desc, tie: frozenset, head: bool):
  """Fresh Linen params whose W2 of the layers in `tie` is one array (tied
  weights); with `head`, a parameter outside the layers is that array too."""
  params = jax.tree.map(jnp.copy, dict(linen_trained(desc, 'adam', 0).params))
  params = {k: dict(v) for k, v in params.items()}
  shared = params['DotReluDot_0']['W2']
  for i in tie:
    params[f'DotReluDot_{i}']['W2'] = shared
  if head:
    params['head'] = {'kernel': shared}
  return params


HEAD_RULE = converters.PathRule('head/kernel', 'head/kernel')


def fresh_arrays(params) -> list:
  return jax.tree.leaves(params)


def late_failing_target(desc, path):
  """The abstract NNX model of `desc` with the Param at `path` in bfloat16."""
  model = nnx_abstract(desc, 'adam')[0]
  graphdef, state = nnx.split(model)
  state = jax.tree.map(lambda x: x, state)  # new Variables: the cached target stays as it is
  node = state
  for key in path:
    node = node[key]
  node.set_value(jax.ShapeDtypeStruct(node.shape, jnp.bfloat16, sharding=node.sharding))
  return nnx.merge(graphdef, state)


@pytest.mark.parametrize('head', [False, True], ids=['tied layers', 'tied layers and a kept head'])
def test_donate_keeps_a_buffer_two_parameters_share(head):
  looped = description('device', False)
  params = tied_params(looped, frozenset({1, 2}), head=head)
  shared = params['DotReluDot_0']['W2'].value
  paths = KIT_PATHS + [HEAD_RULE] if head else KIT_PATHS
  expected = converters.linen_to_nnx({'params': jax.tree.map(jnp.copy, params)}, paths=paths, scan=True)
  out = converters.linen_to_nnx({'params': params}, paths=paths, scan=True, donate=True)
  assert not shared.is_deleted()
  if head:
    assert out['head']['kernel'][...] is shared  # kept: the input array itself
  assert_trees_bit_equal(nnx.to_pure_dict(out), nnx.to_pure_dict(expected))
  # The untied layer parameters were relaid and freed.
  assert params['DotReluDot_0']['Dense_0']['kernel'].value.is_deleted()


def test_donate_deletes_nothing_when_a_check_fails_after_planning():
  looped, scanned = description('device', False), description('device', True)
  params = tied_params(looped, frozenset(), head=False)  # fresh, untied
  target = late_failing_target(scanned, ('layers', 'w2'))
  with pytest.raises(converters.ShapeError, match='model/layers/w2: converted dtype float32'):
    converters.linen_to_nnx({'params': params}, target=target, scan=True, donate=True, paths=KIT_PATHS)
  assert not any(x.is_deleted() for x in fresh_arrays(params))


def nnx_params(params, paths):
  """The NNX state of Linen `params` in the same layout: the same arrays, so
  ties between Linen parameters are ties between NNX ones."""
  return converters.linen_to_nnx({'params': params}, paths=paths)


@given(
    direction=st.sampled_from(['linen -> nnx', 'nnx -> linen']),
    scan_source=st.booleans(),
    tie=st.frozensets(st.integers(1, 2)),
    head=st.booleans(),
    failure=st.sampled_from([None, 'late: dtype', 'early: num_layers']),
    late_path=st.sampled_from(['w2', 'dot1/kernel']),
)
@example(direction='linen -> nnx', scan_source=False, tie=frozenset({1, 2}), head=True, failure=None, late_path='w2')
@example(direction='linen -> nnx', scan_source=False, tie=frozenset({1}), head=False, failure=None, late_path='w2')
@example(direction='linen -> nnx', scan_source=False, tie=frozenset({1}), head=False, failure='late: dtype', late_path='w2')
@example(direction='linen -> nnx', scan_source=True, tie=frozenset(), head=False, failure='late: dtype', late_path='dot1/kernel')
@example(direction='nnx -> linen', scan_source=False, tie=frozenset({2}), head=True, failure=None, late_path='w2')
def test_donate_frees_exactly_the_unshared_relaid_sources_or_nothing(
    direction, scan_source, tie, head, failure, late_path
):
  source, target_desc = description('device', scan_source), description('device', not scan_source)
  if scan_source:
    params = {k: dict(v) for k, v in jax.tree.map(jnp.copy, dict(linen_trained(source, 'adam', 0).params)).items()}
    if head:  # a kept parameter that is the stacked array itself
      params['head'] = {'kernel': params['ScanDotReluDot_0']['W2']}
  else:
    params = tied_params(source, tie, head)
  paths = KIT_PATHS + [HEAD_RULE] if head else KIT_PATHS
  convert = converters.linen_to_nnx
  tree = {'params': params}
  if direction == 'nnx -> linen':
    convert, tree = converters.nnx_to_linen, nnx_params(params, paths)
    if failure == 'late: dtype':
      failure = None  # without an optimizer there is no target to fail against
  inputs = jax.tree.leaves(tree)
  before = [np.asarray(x).copy() for x in inputs]
  kwargs = dict(paths=paths, scan=not scan_source)
  expected = convert(jax.tree.map(jnp.copy, tree), **kwargs)
  if failure == 'early: num_layers':
    kwargs['num_layers'] = 5
  if failure == 'late: dtype':
    layer = ('layers',) + ((1,) if scan_source else ()) + tuple(late_path.split('/'))
    kwargs['target'] = late_failing_target(target_desc, layer)
    if head:
      return  # the target model has no head; a head case is a success case
  if failure is not None:
    with pytest.raises(converters.ConversionError):
      convert(tree, donate=True, **kwargs)
    # Nothing deleted, nothing changed.
    assert not any(x.is_deleted() for x in inputs)
    for x, b in zip(inputs, before):
      assert np.array_equal(np.asarray(x).view(np.uint8), b.view(np.uint8))
    return
  out = convert(tree, donate=True, **kwargs)
  as_dict = lambda t: nnx.to_pure_dict(t) if isinstance(t, nnx.State) else jax.tree.map(np.asarray, t)
  assert_trees_bit_equal(as_dict(out), as_dict(expected))
  uses = collections.Counter(id(x) for x in inputs)
  kept = {id(x) for x in jax.tree.leaves(out)}
  for x in inputs:
    assert x.is_deleted() == (uses[id(x)] == 1 and id(x) not in kept)


# -- rules= and meshes -------------------------------------------------------------


def test_rules_given_to_the_conversion_go_with_the_output():
  desc = description('logical', False)
  mesh = desc.make_mesh()
  params = linen_trained(desc, 'adam', 0).params
  rules = tuple(desc.rules)
  ruleless = jax.tree.map(
      lambda b: b.replace(rules=None), params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
  )
  state = converters.linen_to_nnx({'params': ruleless}, rules=rules, paths=KIT_PATHS)
  kernel = state['layers'][0]['dot1']['kernel']
  assert kernel.get_metadata()['sharding_rules'] == rules
  with jax.set_mesh(mesh):
    named = nnx.get_named_sharding(state, mesh)
  assert named['layers'][0]['dot1']['kernel'].spec == kernel[...].sharding.spec
  back = converters.nnx_to_linen(state, paths=KIT_PATHS)
  assert back['params']['DotReluDot_0']['Dense_0']['kernel'].rules == rules


def test_paths_can_be_any_iterable_of_rules():
  desc = description('device', False)
  params = {'params': linen_trained(desc, 'adam', 0).params}
  as_list = converters.linen_to_nnx(params, paths=list(KIT_PATHS.rules))
  as_generator = converters.linen_to_nnx(params, paths=(r for r in KIT_PATHS.rules))
  expected = converters.linen_to_nnx(params, paths=KIT_PATHS)
  assert_trees_bit_equal(nnx.to_pure_dict(as_list), nnx.to_pure_dict(expected))
  assert_trees_bit_equal(nnx.to_pure_dict(as_generator), nnx.to_pure_dict(expected))


def test_unsharded_arrays_outside_any_mesh_are_relaid_on_their_device():
  """A model trained on one device (no mesh, no annotations) stacks and unstacks too."""
  layers = {f'Block_{i}': {'w': jnp.full((3, 2), float(i))} for i in range(3)}
  paths = converters.PathMapping([converters.PathRule('Block_{i}/w', 'blocks/{i}/w', 'Blocks/w', 'blocks/w')])
  stacked = converters.relayout({'params': layers}, scan=True, paths=paths)
  w = stacked['params']['Blocks']['w']
  np.testing.assert_array_equal(w, np.stack([np.full((3, 2), float(i)) for i in range(3)]))
  assert w.devices() == layers['Block_0']['w'].devices()
  looped = converters.relayout(stacked, scan=False, paths=paths)
  assert_trees_bit_equal(looped['params'], layers)


def test_unplaced_layers_on_different_devices_are_refused():
  devices = jax.devices()
  layers = {f'Block_{i}': {'w': jax.device_put(jnp.zeros((2,)), devices[i])} for i in range(2)}
  paths = converters.PathMapping([converters.PathRule('Block_{i}/w', 'blocks/{i}/w', 'Blocks/w', 'blocks/w')])
  with pytest.raises(converters.LayoutError, match=r'Blocks/w: its arrays have no NamedSharding and lie on devices \[0, 1\]'):
    converters.relayout({'params': layers}, scan=True, paths=paths)


def test_unplaced_arrays_on_different_devices_convert_each_on_its_own():
  devices = jax.devices()
  layers = {
      f'Block_{i}': {'w': jax.device_put(jnp.full((2,), float(i)), devices[i])} for i in range(2)
  }
  paths = converters.PathMapping([
      converters.PathRule('Block_{i}/w', 'blocks/{i}/w', transform=converters.Rearrange('(a b) -> b a', a=1)),
  ])
  state = converters.linen_to_nnx({'params': layers}, paths=paths)
  for i in range(2):
    value = state['blocks'][i]['w'][...]
    assert value.shape == (2, 1) and value.devices() == {devices[i]}
    np.testing.assert_array_equal(value, np.full((2, 1), float(i)))


def test_an_abstract_train_state_converts_into_an_abstract_target():
  """`jax.eval_shape` of a TrainState: every leaf, the step too, comes out abstract."""
  desc = description('device', False)
  state = linen_trained(desc, 'adam', 0)
  abstract = jax.eval_shape(lambda: state)
  model, optimizer = converters.linen_to_nnx(
      abstract, target=nnx_abstract(desc, 'adam'), paths=KIT_PATHS
  )
  step = optimizer.step.get_value()
  assert isinstance(step, jax.ShapeDtypeStruct) and step.shape == () and step.dtype == jnp.uint32
  leaves = jax.tree.leaves(nnx.state((model, optimizer)))
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def test_a_collection_that_converts_to_nothing_is_left_out_without_a_target():
  layers = {f'Block_{i}': {'w': jnp.full((3, 2), float(i))} for i in range(2)}
  paths = converters.PathMapping([converters.PathRule('Block_{i}/w', 'blocks/{i}/w', 'Blocks/w', 'blocks/w')])
  stacked = converters.relayout({'params': layers, 'cache': {}}, scan=True, paths=paths)
  assert list(stacked) == ['params']
  back = converters.nnx_to_linen(converters.linen_to_nnx({'params': layers, 'cache': {}}, paths=paths), paths=paths)
  assert list(back) == ['params']


def test_linen_outputs_keep_the_converted_order_of_their_leaves():
  """A target of another order only says what each leaf must be; the output
  keeps the converted order, as without a target."""
  paths = converters.PathMapping([converters.PathRule('y', 'a'), converters.PathRule('x', 'b')])
  state = nnx.State({'a': nnx.Param(jnp.ones(2)), 'b': nnx.Param(jnp.zeros(2))})
  target = {'params': {'x': jnp.zeros(2), 'y': jnp.zeros(2)}}
  without = converters.nnx_to_linen(state, paths=paths)
  with_target = converters.nnx_to_linen(state, target=target, paths=paths)
  assert list(without['params']) == ['y', 'x']
  assert list(with_target['params']) == ['y', 'x']


# -- state only one side has (one-sided rules) ----------------------------------------


class LinenBuffered(nn.Module):
  """Keeps the table in a collection of its own; its port computes it on the fly."""

  @nn.compact
  def __call__(self, x):
    from tests.converters.checkpoint.small_models import sinusoid

    table = self.variable('consts', 'table', sinusoid)
    return nn.Dense(4)(x + table.value)


def test_state_only_the_port_has_is_kept_from_a_real_target_and_left_out_of_a_source():
  from tests.converters.checkpoint import small_models as small

  x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
  linen = small.LinenTabled()
  variables = linen.init(jax.random.key(0), x)
  target = small.nnx_table_variable()
  before = copy_tree(nnx.state(target))
  model = converters.linen_to_nnx(variables, target=target, paths=small.TABLE_VARIABLE_PATHS)
  assert model.table is not target.table and model.table[...] is target.table[...]
  assert_trees_bit_equal(nnx.state(target), before)
  np.testing.assert_array_equal(model.dense.kernel[...], variables['params']['Dense_0']['kernel'])
  # Linen computes the table inside its jitted apply, NNX holds it computed
  # eagerly at construction: one ulp apart at most (3.7e-9 seen), not a program.
  np.testing.assert_allclose(model(x), linen.apply(variables, x), rtol=0, atol=1e-6)
  # From NNX, the table is left out; without a target, it is not written.
  back = converters.nnx_to_linen(model, paths=small.TABLE_VARIABLE_PATHS)
  assert_trees_bit_equal(back, variables)
  state = converters.linen_to_nnx(variables, paths=small.TABLE_VARIABLE_PATHS)
  assert 'table' not in state


def test_state_only_the_port_has_is_refused_with_the_rule_to_write_or_from_an_abstract_target():
  from tests.converters.checkpoint import small_models as small

  variables = small.LinenTabled().init(jax.random.key(0), np.ones((2, 8), np.float32))
  rule = r"PathRule.nnx_only\('table'\)"
  with pytest.raises(converters.StructureError, match=f'model/table: no Linen collection .*{rule}'):
    converters.nnx_to_linen(small.nnx_table_variable(), paths=small.TABLED_PATHS)
  with pytest.raises(converters.StructureError, match=r'source lacks \[model/table \(no rule names it\)\].*PathRule.nnx_only'):
    converters.linen_to_nnx(variables, target=small.nnx_table_variable(), paths=small.TABLED_PATHS)
  abstract = nnx.eval_shape(small.nnx_table_variable)
  with pytest.raises(converters.StructureError, match=r'abstract where it holds state only NNX has: model/table.*build the target for real'):
    converters.linen_to_nnx(variables, target=abstract, paths=small.TABLE_VARIABLE_PATHS)


def test_a_plain_array_attribute_named_by_a_one_sided_rule_is_kept_from_a_real_target():
  from tests.converters.checkpoint import small_models as small

  variables = small.LinenTabled().init(jax.random.key(0), np.ones((2, 8), np.float32))
  target = small.nnx_tabled()
  paths = small.TABLED_PATHS + [converters.PathRule.nnx_only('table')]
  model = converters.linen_to_nnx(variables, target=target, paths=paths)
  assert model.table is target.table
  assert_trees_bit_equal(converters.nnx_to_linen(model, paths=paths), variables)


def test_state_only_linen_has_is_kept_from_a_linen_target_and_left_out_of_a_linen_source():
  x = np.ones((2, 8), np.float32)
  variables = LinenBuffered().init(jax.random.key(0), x)
  port = nnx.Linear(8, 4, rngs=nnx.Rngs(1))
  paths = converters.PathMapping([
      converters.PathRule('Dense_0/kernel', 'kernel'), converters.PathRule('Dense_0/bias', 'bias'),
      converters.PathRule.linen_only('table'),
  ])
  model = converters.linen_to_nnx(variables, target=port, paths=paths)  # no 'consts' type needed
  np.testing.assert_array_equal(model.kernel[...], variables['params']['Dense_0']['kernel'])
  back = converters.nnx_to_linen(model, target=variables, paths=paths)
  assert back['consts']['table'] is variables['consts']['table']
  assert_trees_bit_equal(back, variables)
  abstract = jax.eval_shape(lambda: variables)
  with pytest.raises(converters.StructureError, match=r'abstract where it holds state only Linen has: consts/table'):
    converters.nnx_to_linen(model, target=abstract, paths=paths)


def test_within_nnx_state_only_the_port_has_relays_out_as_any_other():
  state = nnx.State({'blocks': {i: {'w': nnx.Param(jnp.full((3,), float(i))), 'table': nnx.Variable(jnp.arange(2.0) + i)} for i in range(2)}})
  paths = converters.PathMapping([
      converters.PathRule('Block_{i}/w', 'blocks/{i}/w', 'Blocks/w', 'blocks/w'),
      converters.PathRule.nnx_only('blocks/{i}/table', nnx_stacked='blocks/table'),
  ])
  stacked = converters.relayout(state, scan=True, paths=paths)
  assert type(stacked['blocks']['table']) is nnx.Variable
  np.testing.assert_array_equal(stacked['blocks']['table'][...], [[0.0, 1.0], [1.0, 2.0]])
  assert 'table' not in converters.nnx_to_linen(state, paths=paths)['params']['Block_0']


def test_state_only_the_port_has_that_the_optimizer_trains_is_refused_both_ways():
  from flax.training import train_state

  from tests.converters.checkpoint import small_models as small

  class TrainedTable(small.NNXTableVariable):
    def __init__(self, rngs):
      super().__init__(rngs)
      self.table = nnx.Param(small.sinusoid())

  variables = small.LinenTabled().init(jax.random.key(0), np.ones((2, 8), np.float32))
  tx = optax.adam(1e-3)
  state = train_state.TrainState.create(apply_fn=None, params=variables['params'], tx=tx)
  model = TrainedTable(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  message = r'model/table: named by a one-sided rule .* the optimizer trains it'
  with pytest.raises(converters.StructureError, match='target/' + message):
    converters.linen_to_nnx(state, target=(model, optimizer), paths=small.TABLE_VARIABLE_PATHS)
  with pytest.raises(converters.StructureError, match='^' + message):
    converters.nnx_to_linen((model, optimizer), target=state, paths=small.TABLE_VARIABLE_PATHS)


def test_a_source_path_converted_onto_state_only_the_target_has_is_refused_not_dropped():
  """An identity mapping (`keep_unmatched`) beside a one-sided rule of the same path."""
  state = nnx.State({'table': nnx.Param(jnp.array([7.0, 8.0, 9.0]))})
  target = {'params': {'table': jnp.array([10.0, 11.0, 12.0])}}
  paths = converters.PathMapping([converters.PathRule.linen_only('table')], keep_unmatched=True)
  message = r'source paths convert onto paths a one-sided rule says only Linen has: table <- table'
  with pytest.raises(converters.PathMappingError, match=message):
    converters.nnx_to_linen(state, target=target, paths=paths)
  with pytest.raises(converters.PathMappingError, match=message):
    converters.nnx_to_linen(state, paths=paths)
  paths = converters.PathMapping([converters.PathRule.nnx_only('table')], keep_unmatched=True)
  with pytest.raises(converters.PathMappingError, match='only NNX has: table <- table'):
    converters.linen_to_nnx(target, paths=paths)


def test_state_the_optimizer_trains_is_not_state_only_one_side_has():
  """Whatever the optimizer trains (its `wrt`), on either side, has optimizer
  state too: a one-sided rule naming it is refused, not dropped."""
  from flax.training import train_state

  from tests.converters.checkpoint import small_models as small

  tx = optax.adam(1e-3)
  model = small.NNXLearnedTable(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, tx, wrt=(nnx.Param, small.PositionTable))
  variables = small.LinenTabled().init(jax.random.key(0), np.ones((2, 8), np.float32))
  state = train_state.TrainState.create(apply_fn=None, params=variables['params'], tx=tx)
  with pytest.raises(converters.StructureError, match='model/table: named by a one-sided rule .* the optimizer trains it'):
    converters.linen_to_nnx(state, target=(model, optimizer), paths=small.TABLE_VARIABLE_PATHS)
  # Linen: a parameter named by a linen_only rule.
  params = {**variables['params'], 'table': small.sinusoid()}
  state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
  paths = small.TABLED_PATHS + [converters.PathRule.linen_only('table')]
  port = small.nnx_tabled_free()
  with pytest.raises(converters.StructureError, match=r'params/table: named by a one-sided rule \(state only Linen has\)'):
    converters.linen_to_nnx(state, target=(port, nnx.Optimizer(port, tx, wrt=nnx.Param)), paths=paths)
  with pytest.raises(converters.StructureError, match=r'target.params/table: named by a one-sided rule'):
    converters.nnx_to_linen((port, nnx.Optimizer(port, tx, wrt=nnx.Param)), target=state, paths=paths)


def test_a_numpy_attribute_kept_from_the_target_is_a_copy():
  from tests.converters.checkpoint import small_models as small

  class Masked(nnx.Module):
    def __init__(self):
      self.mask = np.ones(8, np.float32)
      self.dense = nnx.Linear(8, 4, rngs=nnx.Rngs(0))

  variables = small.LinenTabled().init(jax.random.key(0), np.ones((2, 8), np.float32))
  target = Masked()
  paths = small.TABLED_PATHS + [converters.PathRule.nnx_only('mask')]
  model = converters.linen_to_nnx(variables, target=target, paths=paths)
  assert model.mask is not target.mask
  np.testing.assert_array_equal(model.mask, target.mask)


def test_wrt_fills_the_parameters_of_a_model_and_keeps_its_other_state():
  """`{'params': ...}` into a port with batch statistics, which the target keeps."""
  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.BatchNorm(use_running_average=True)(nn.Dense(4)(x))

  class Port(nnx.Module):
    def __init__(self, rngs):
      self.dense = nnx.Linear(8, 4, rngs=rngs)
      self.bn = nnx.BatchNorm(4, rngs=rngs)

  variables = Linen().init(jax.random.key(0), np.ones((2, 8), np.float32))
  paths = converters.PathMapping([
      converters.PathRule('Dense_0/kernel', 'dense/kernel'), converters.PathRule('Dense_0/bias', 'dense/bias'),
      converters.PathRule('BatchNorm_0/scale', 'bn/scale'), converters.PathRule('BatchNorm_0/bias', 'bn/bias'),
      converters.PathRule('BatchNorm_0/mean', 'bn/mean'), converters.PathRule('BatchNorm_0/var', 'bn/var'),
  ])
  target = Port(nnx.Rngs(1))
  target.bn.mean[...] = jnp.full((4,), 3.0)
  model = converters.linen_to_nnx({'params': variables['params']}, target=target, paths=paths, wrt=nnx.Param)
  np.testing.assert_array_equal(model.dense.kernel[...], variables['params']['Dense_0']['kernel'])
  assert model.bn.mean is not target.bn.mean and model.bn.mean[...] is target.bn.mean[...]
  with pytest.raises(converters.StructureError, match=r'the source has \[model/bn/mean'):
    converters.linen_to_nnx(variables, target=target, paths=paths, wrt=nnx.Param)  # batch_stats too
  from flax.training import train_state

  tx = optax.sgd(0.1)
  state = train_state.TrainState.create(apply_fn=None, params=variables['params'], tx=tx)
  for linen, wrong in (
      ({'params': variables['params']}, {}),  # no target: nothing to fill
      (state, {'target': (target, nnx.Optimizer(target, tx, wrt=nnx.Param))}),
  ):
    with pytest.raises(converters.StructureError, match='wrt= selects the Variables of a target model'):
      converters.linen_to_nnx(linen, paths=paths, wrt=nnx.Param, **wrong)
  with pytest.raises(converters.StructureError, match=r'wrt=42: not an nnx filter'):
    converters.linen_to_nnx({'params': variables['params']}, target=target, paths=paths, wrt=42)
