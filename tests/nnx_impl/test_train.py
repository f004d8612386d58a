"""Tests of `nnx_impl.train`: sharded creation, train steps and apply."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from kit_mlp.data import make_batches
from kit_mlp.description import FSDP_RULES
from kit_mlp.optimizers import OPTIMIZERS
from nnx_impl import train
from nnx_impl.sgd import SGD
from tests.helpers import (
    EMBED_FIRST_FSDP_RULES,
    MATRIX,
    MOMENTS_PER_PARAM,
    assert_sharded_as,
    assert_trees_bit_equal,
    expected_names,
    expected_sharding,
    activation_constraints,
    expected_activation_constraints,
    largest_array_in_program,
    largest_shard,
    parameter_pairs,
    describe,
    matrix_id,
    run_case,
)

NUM_STEPS = 3


@functools.cache
def run(case, optimizer='adam', dtype='float32'):
  return run_case(train.make_trainer, case, optimizer, NUM_STEPS, dtype)


def check_state_shardings(r, arrays):
  desc, mesh = r['desc'], r['mesh']
  annotated = 0
  for path, var in nnx.to_flat_state(r['trainer'].to_state(arrays)):
    where = '/'.join(map(str, path))
    names = var.get_metadata().get('out_sharding')
    if names is not None:
      assert names == expected_names(desc, path[-1]), where
      if desc.logical:
        assert var.get_metadata()['sharding_rules'] == desc.rules, where
      assert_sharded_as(var[...], expected_sharding(desc, mesh, names), where)
      annotated += 1
    else:  # step counters
      assert var.ndim == 0, f'{where} is an unannotated array'
      assert_sharded_as(var[...], NamedSharding(mesh, P()), where)
  return annotated


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_every_param_and_moment_is_sharded_as_annotated(case):
  r = run(case)
  # Each param and its two adam moments, mu and nu.
  annotated = len(parameter_pairs(r['desc'])) * (1 + MOMENTS_PER_PARAM['adam'])
  for state in (r['initial'], r['stepped'], r['scanned']):
    assert check_state_shardings(r, state) == annotated


@pytest.mark.parametrize('optimizer', OPTIMIZERS)
def test_optimizer_state_is_sharded_as_annotated(optimizer):
  r = run(MATRIX[-1], optimizer)  # 4x2, scanned, FSDP rules: two stacked params
  # Each param and each of its moments (adam: mu and nu; momentum: one trace).
  params = len(parameter_pairs(r['desc']))
  assert check_state_shardings(r, r['stepped']) == params * (1 + MOMENTS_PER_PARAM[optimizer])


def test_fsdp_sgd_is_the_hand_written_sgd():
  r = run(MATRIX[-1], 'fsdp_sgd')
  _, optimizer = r['trainer'].merge(r['stepped'])
  assert isinstance(optimizer, SGD)
  assert int(optimizer.step[...]) == NUM_STEPS


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_output_is_sharded_data_none(case):
  r = run(case)
  expected = NamedSharding(r['mesh'], P('data', None))
  with jax.set_mesh(r['mesh']):
    y = r['trainer'].apply(r['stepped'], r['xs'][0])
    # Without out_shardings, the model's own constraint decides.
    model, _ = r['trainer'].merge(r['stepped'])
    y_free = nnx.jit(lambda m, x: m(x))(model, r['xs'][0])
  assert y.shape == (r['desc'].batch, r['desc'].depth)
  assert_sharded_as(y, expected, 'apply output')
  assert_sharded_as(y_free, expected, 'unconstrained jit output')


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_activations_are_constrained_as_annotated(case):
  r = run(case)
  x = r['xs'][0]
  with jax.set_mesh(r['mesh']):
    jaxpr = jax.make_jaxpr(lambda m, x: m(x))(r['trainer'].merge(r['stepped'])[0], x)
  found = activation_constraints(jaxpr, x.shape)
  assert found == expected_activation_constraints(r['desc'])


@pytest.mark.parametrize('rules', [FSDP_RULES, EMBED_FIRST_FSDP_RULES], ids=['batch-first', 'embed-first'])
def test_the_rule_listed_first_takes_a_mesh_axis_two_activation_dimensions_want(rules):
  # 'batch' and 'embed' both go to 'data': the output is ('data', None) or (None, 'data').
  desc = describe((2, 4), False, 'logical-fsdp', rules=rules)
  mesh = desc.make_mesh()
  trainer = train.make_trainer(desc, mesh, 'adam')
  with jax.set_mesh(mesh):
    x = make_batches(desc, mesh)[0]
    jaxpr = jax.make_jaxpr(lambda m, x: m(x))(trainer.merge(trainer.create(seed=0))[0], x)
  found = activation_constraints(jaxpr, x.shape)
  assert found == expected_activation_constraints(desc)
  assert found[1] == (('data', None) if rules == FSDP_RULES else (None, 'data'))


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_scanned_steps_equal_single_steps(case):
  r = run(case)
  assert_trees_bit_equal(r['scanned'], r['stepped'])
  assert_trees_bit_equal(r['scanned_losses'], r['losses'])
  assert int(r['scanned']['optimizer']['step']) == NUM_STEPS


@pytest.mark.parametrize('optimizer', OPTIMIZERS)
def test_training_lowers_the_loss(optimizer):
  r = run(MATRIX[0], optimizer)
  trainer = r['trainer']
  x, y = r['xs'][0], r['ys'][0]
  with jax.set_mesh(r['mesh']):
    state = jax.tree.map(jnp.copy, r['initial'])
    _, losses = trainer.train_steps(state, jnp.stack([x] * 5), jnp.stack([y] * 5))
  assert losses[-1] < losses[0], losses


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_creation_never_materialises_a_whole_array_on_one_device(case):
  r = run(case)
  with jax.set_mesh(r['mesh']):
    largest = largest_array_in_program(r['trainer'].create, 0)
  # The per-device program XLA compiles for creation, random bits included,
  # holds nothing bigger than one device's shard of the biggest array.
  assert largest <= largest_shard(r['initial'])


def test_abstract_state_matches_created_state():
  r = run(MATRIX[7])  # scanned under logical FSDP rules: stacked, annotated by name; a run CI makes anyway
  abstract, created = r['trainer'].abstract_state, r['trainer'].to_state(r['initial'])
  assert jax.tree.structure(abstract) == jax.tree.structure(created)
  for a, c in zip(jax.tree.leaves(abstract), jax.tree.leaves(created)):
    assert (a.shape, a.dtype) == (c.shape, c.dtype)
    assert_sharded_as(c, a.sharding, 'created leaf')


def test_to_state_rejects_arrays_of_another_structure():
  r = run(MATRIX[0])
  arrays = dict(r['initial'], extra={'w': r['xs'][0]})
  with pytest.raises(ValueError, match="unexpected \\[\\('extra', 'w'\\)\\]"):
    r['trainer'].to_state(arrays)


@pytest.mark.parametrize('case', MATRIX[1::6], ids=matrix_id)
def test_bfloat16_params_train_and_scan_like_single_steps(case):
  r = run(case, dtype='bfloat16')
  leaves = jax.tree.leaves(r['stepped'])
  assert {leaf.dtype for leaf in leaves if leaf.ndim} == {jnp.dtype('bfloat16')}
  check_state_shardings(r, r['stepped'])
  assert_trees_bit_equal(r['scanned'], r['stepped'])
  assert_trees_bit_equal(r['scanned_losses'], r['losses'])
