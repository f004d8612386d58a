"""Tests of `converters.testing` on a model pair that is not the kit's MLP.

A two-layer network with biases and a LayerNorm, written in Linen and in NNX,
related by a user-written `PathMapping`: the assertions pass on a faithful
port and fail, naming the parameter, on a broken one.
"""

from __future__ import annotations

import jax
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from converters import PathMapping, PathRule
from converters.errors import PathMappingError
from converters.testing import (
    assert_port_equivalent,
    assert_same_layout,
    assert_same_outputs,
    assert_same_values,
)
from kit_mlp.description import ModelDescription

IN, HIDDEN, OUT = 16, 32, 8
lecun, zeros, ones = nn.initializers.lecun_normal(), nn.initializers.zeros, nn.initializers.ones


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(
        HIDDEN,
        kernel_init=nn.with_partitioning(lecun, (None, 'model')),
        bias_init=nn.with_partitioning(zeros, ('model',)),
    )(x)
    x = nn.LayerNorm(
        scale_init=nn.with_partitioning(ones, ('model',)),
        bias_init=nn.with_partitioning(zeros, ('model',)),
    )(x)
    x = nn.relu(x)
    return nn.Dense(
        OUT,
        kernel_init=nn.with_partitioning(lecun, ('model', None)),
        bias_init=nn.with_partitioning(zeros, (None,)),
    )(x)


class NNXNet(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, w2_sharding=('model', None)):
    self.fc1 = nnx.Linear(
        IN, HIDDEN,
        kernel_init=nnx.with_partitioning(lecun, (None, 'model')),
        bias_init=nnx.with_partitioning(zeros, ('model',)),
        rngs=rngs,
    )
    self.norm = nnx.LayerNorm(
        HIDDEN,
        scale_init=nnx.with_partitioning(ones, ('model',)),
        bias_init=nnx.with_partitioning(zeros, ('model',)),
        rngs=rngs,
    )
    self.fc2 = nnx.Linear(
        HIDDEN, OUT,
        kernel_init=nnx.with_partitioning(lecun, w2_sharding),
        bias_init=nnx.with_partitioning(zeros, (None,)),
        rngs=rngs,
    )

  def __call__(self, x):
    return self.fc2(nnx.relu(self.norm(self.fc1(x))))


PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'fc1/kernel'),
    PathRule('Dense_0/bias', 'fc1/bias'),
    PathRule('LayerNorm_0/scale', 'norm/scale'),
    PathRule('LayerNorm_0/bias', 'norm/bias'),
    PathRule('Dense_1/kernel', 'fc2/kernel'),
    PathRule('Dense_1/bias', 'fc2/bias'),
])


@pytest.fixture(scope='module')
def setup():
  mesh = ModelDescription(mesh_shape=(2, 4)).make_mesh()
  with jax.set_mesh(mesh):
    x = jax.device_put(jax.random.normal(jax.random.key(1), (8, IN)), NamedSharding(mesh, P('data', None)))
    abstract = jax.eval_shape(LinenNet().init, jax.random.key(0), x)
    variables = jax.jit(LinenNet().init, out_shardings=nn.get_sharding(abstract, mesh))(jax.random.key(0), x)
    model = nnx.jit(lambda: NNXNet(nnx.Rngs(7)))()
    broken = nnx.jit(lambda: NNXNet(nnx.Rngs(7), w2_sharding=(None, None)))()
  return mesh, x, variables, model, broken


def test_faithful_port_passes(setup):
  mesh, x, variables, model, _ = setup
  with jax.set_mesh(mesh):
    assert_same_layout(variables, model, paths=PATHS)
    assert_same_outputs(LinenNet(), variables, model, x, paths=PATHS)


@pytest.mark.nightly  # CI: testing/test_port.py::test_keyword_inputs_are_inputs_of_both_calls (a port proven with paths='infer'), test_a_rule_with_a_transform_is_checked_on_a_mesh
def test_the_whole_port_with_the_mapping_inferred(setup):
  mesh, x, variables, model, _ = setup
  with jax.set_mesh(mesh):
    assert_port_equivalent(LinenNet(), variables, model, x, paths='infer')


def test_model_is_not_modified(setup):
  mesh, x, variables, model, _ = setup
  before = jax.tree.map(lambda a: a, nnx.to_pure_dict(nnx.state(model)))
  with jax.set_mesh(mesh):
    assert_same_outputs(LinenNet(), variables, model, x, paths=PATHS)
  after = nnx.to_pure_dict(nnx.state(model))
  assert jax.tree.structure(before) == jax.tree.structure(after)
  assert all(a is b for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True))


def test_different_annotation_is_reported_with_both_specs(setup):
  mesh, _, variables, _, broken = setup
  with jax.set_mesh(mesh), pytest.raises(AssertionError) as info:
    assert_same_layout(variables, broken, paths=PATHS)
  message = str(info.value)
  assert 'fc2/kernel' in message and "P('model', None)" in message and 'P(None, None)' in message
  assert 'fc1/kernel' not in message


def test_different_values_are_reported_with_max_diff_and_where(setup):
  _, _, variables, model, _ = setup
  with pytest.raises(AssertionError) as info:
    assert_same_values(variables, nnx.state(model), paths=PATHS)  # NNX drew its own init
  assert 'fc1/kernel' in str(info.value) and 'max abs diff' in str(info.value)


def test_a_port_bug_shows_in_the_outputs(setup):
  mesh, x, variables, _, _ = setup

  class Ported(NNXNet):  # LayerNorm epsilon: Linen's default is 1e-6
    def __init__(self, rngs):
      super().__init__(rngs)
      self.norm.epsilon = 1e-2

  with jax.set_mesh(mesh):
    ported = nnx.jit(lambda: Ported(nnx.Rngs(0)))()
    with pytest.raises(AssertionError) as info:
      assert_same_outputs(LinenNet(), variables, ported, x, paths=PATHS)
  assert 'output 0' in str(info.value) and 'at index' in str(info.value)


def test_unmapped_parameters_fail_loudly(setup):
  mesh, x, variables, model, _ = setup
  partial = PathMapping(PATHS.rules[:-1])
  with jax.set_mesh(mesh), pytest.raises(PathMappingError, match='no rule maps these linen paths: Dense_1/bias'):
    assert_same_outputs(LinenNet(), variables, model, x, paths=partial)


def test_outputs_with_the_mapping_inferred_and_tree_checks_say_what_to_pass(setup):
  mesh, x, variables, model, broken = setup
  with jax.set_mesh(mesh):
    assert_same_outputs(LinenNet(), variables, model, x, paths='infer')
    for check in (assert_same_layout, assert_same_values):
      with pytest.raises(PathMappingError, match=r'pass paths=converters\.infer_paths\(linen_module'):
        check(variables, model, paths='infer')
