"""Tests of `linen_impl.train`: sharded creation, train steps and apply."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from flax.core import meta
from jax.sharding import NamedSharding, PartitionSpec as P

from kit_mlp.data import make_batches
from kit_mlp.description import FSDP_RULES
from kit_mlp.optimizers import OPTIMIZERS, make_tx
from linen_impl import train
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
  make = lambda desc, mesh, opt: train.make_trainer(desc, mesh, make_tx(opt))
  return run_case(make, case, optimizer, NUM_STEPS, dtype)


def boxed_leaves(tree):
  """`(path, box)` for every annotated leaf of a boxed tree."""
  return jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, meta.Partitioned)
  )[0]


def check_state_shardings(r, state):
  desc, mesh = r['desc'], r['mesh']
  annotated = 0
  for path, leaf in boxed_leaves(state):
    where = jax.tree_util.keystr(path)
    if isinstance(leaf, meta.Partitioned):
      param_name = path[-1].key
      assert leaf.names == expected_names(desc, param_name), where
      assert_sharded_as(leaf.value, expected_sharding(desc, mesh, leaf.names), where)
      annotated += 1
    else:  # step counters
      assert leaf.ndim == 0, f'{where} is an unannotated array'
      assert_sharded_as(leaf, NamedSharding(mesh, P()), where)
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


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_output_is_sharded_data_none(case):
  r = run(case)
  expected = NamedSharding(r['mesh'], P('data', None))
  with jax.set_mesh(r['mesh']):
    y = r['trainer'].apply(r['stepped'].params, r['xs'][0])
    # Without out_shardings, the model's own constraint decides.
    y_free = jax.jit(r['trainer'].model.apply)({'params': r['stepped'].params}, r['xs'][0])
  assert y.shape == (r['desc'].batch, r['desc'].depth)
  assert_sharded_as(y, expected, 'apply output')
  assert_sharded_as(y_free, expected, 'unconstrained jit output')


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_activations_are_constrained_as_annotated(case):
  r = run(case)
  x = r['xs'][0]
  with jax.set_mesh(r['mesh']):
    jaxpr = jax.make_jaxpr(lambda p, x: r['trainer'].model.apply({'params': p}, x))(
        r['stepped'].params, x
    )
  found = activation_constraints(jaxpr, x.shape)
  assert found == expected_activation_constraints(r['desc'])


@pytest.mark.parametrize('rules', [FSDP_RULES, EMBED_FIRST_FSDP_RULES], ids=['batch-first', 'embed-first'])
def test_the_rule_listed_first_takes_a_mesh_axis_two_activation_dimensions_want(rules):
  # 'batch' and 'embed' both go to 'data': the output is ('data', None) or (None, 'data').
  desc = describe((2, 4), False, 'logical-fsdp', rules=rules)
  mesh = desc.make_mesh()
  trainer = train.make_trainer(desc, mesh, make_tx('adam'))
  with jax.set_mesh(mesh):
    x = make_batches(desc, mesh)[0]
    jaxpr = jax.make_jaxpr(lambda p, x: trainer.model.apply({'params': p}, x))(trainer.create(seed=0).params, x)
  found = activation_constraints(jaxpr, x.shape)
  assert found == expected_activation_constraints(desc)
  assert found[1] == (('data', None) if rules == FSDP_RULES else (None, 'data'))


@pytest.mark.parametrize('case', MATRIX, ids=matrix_id)
def test_scanned_steps_equal_single_steps(case):
  r = run(case)
  assert_trees_bit_equal(r['scanned'], r['stepped'])
  assert_trees_bit_equal(r['scanned_losses'], r['losses'])
  assert int(r['scanned'].step) == NUM_STEPS


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


@pytest.mark.parametrize('case', MATRIX[1::6], ids=matrix_id)
def test_bfloat16_params_train_and_scan_like_single_steps(case):
  r = run(case, dtype='bfloat16')
  leaves = jax.tree.leaves(r['stepped'])
  assert {leaf.dtype for leaf in leaves if leaf.ndim} == {jnp.dtype('bfloat16')}
  check_state_shardings(r, r['stepped'])
  assert_trees_bit_equal(r['scanned'], r['stepped'])
  assert_trees_bit_equal(r['scanned_losses'], r['losses'])
