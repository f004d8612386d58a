"""Tests of nnx_port.constrained_params: parameters constrained at use as Linen's boxes are."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from nnx_port.constrained_params import ConstrainedParam, constrain_params_at_use
from tests.helpers import compile_with_program, sharding_constraints

init = nn.initializers.lecun_normal()


def auto_mesh(shape=(2, 4)):
  return jax.make_mesh(shape, ('data', 'model'), axis_types=(AxisType.Auto,) * 2)


def constraints_in(fn, *args) -> list[tuple[tuple, P]]:
  """(shape, spec) of every sharding constraint in `fn`'s jaxpr, in order."""
  return [(shape, sharding.spec) for shape, sharding in sharding_constraints(jax.make_jaxpr(fn)(*args))]


def test_a_traced_read_is_constrained_to_the_annotation():
  with jax.set_mesh(auto_mesh()):
    p = ConstrainedParam(jnp.ones((8, 4)), out_sharding=('data', 'model'))
    assert constraints_in(lambda p: p[...] * 2, p) == [((8, 4), P('data', 'model'))]
    assert constraints_in(lambda p: p.get_value() * 2, p) == [((8, 4), P('data', 'model'))]
    # A parameter closed over is a constant: nothing to constrain, no gradient.
    assert constraints_in(lambda: p[...] * 2) == []


def test_an_indexed_read_constrains_the_whole_parameter_then_indexes():
  with jax.set_mesh(auto_mesh()):
    p = ConstrainedParam(jnp.arange(32.0).reshape(8, 4), out_sharding=('data', 'model'))
    assert constraints_in(lambda p: p[1], p) == [((8, 4), P('data', 'model'))]
    np.testing.assert_array_equal(jax.jit(lambda p: p[1:3, 2])(p), np.arange(32.0).reshape(8, 4)[1:3, 2])


@pytest.mark.parametrize('how', ['metadata', 'context'])
def test_logical_names_resolve_through_their_rules(how):
  rules = (('embed', 'data'), ('mlp', 'model'))
  with jax.set_mesh(auto_mesh()):
    if how == 'metadata':
      p = ConstrainedParam(jnp.ones((8, 4)), out_sharding=('embed', 'mlp'), sharding_rules=rules)
      found = constraints_in(lambda p: p[...], p)
    else:
      with nn.logical_axis_rules(rules):
        p = ConstrainedParam(jnp.ones((8, 4)), out_sharding=('embed', 'mlp'))
        found = constraints_in(lambda p: p[...], p)
  assert found == [((8, 4), P('data', 'model'))]


def test_unannotated_parameters_eager_reads_and_no_mesh_are_left_alone():
  x = jnp.arange(8.0)
  assert constraints_in(lambda p: p[...], ConstrainedParam(x)) == []  # no annotation
  p = ConstrainedParam(x, out_sharding=('model',), eager_sharding=False)
  assert constraints_in(lambda p: p[...], p) == []  # no mesh in context
  mesh = auto_mesh()
  with jax.set_mesh(mesh):
    sharded = ConstrainedParam(jax.device_put(x, NamedSharding(mesh, P('model'))), out_sharding=('model',))
    assert sharded[...] is sharded.get_raw_value()  # an eager read: the array itself
    assert constraints_in(lambda p: p[...] + 0, sharded) == [((8,), P('model'))]


def test_a_mesh_in_the_metadata_is_used_without_a_mesh_in_context():
  mesh = auto_mesh()
  p = ConstrainedParam(jnp.ones((8, 4)), out_sharding=('data', None), mesh=mesh)
  assert sharding_constraints(jax.make_jaxpr(lambda p: p[...])(p)) == [((8, 4), NamedSharding(mesh, P('data', None)))]


def test_a_sharding_as_the_annotation_is_the_constraint():
  # Flax's escape hatch from eager sharding without a mesh in context; Flax's
  # own `nnx.get_partition_spec` cannot read it.
  sharding = NamedSharding(auto_mesh(), P('data', 'model'))
  p = ConstrainedParam(jnp.ones((8, 4)), out_sharding=sharding)
  assert sharding_constraints(jax.make_jaxpr(lambda p: p[...])(p)) == [((8, 4), sharding)]


def test_explicit_axes_are_not_constrained_again():
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Explicit,) * 2)
  with jax.set_mesh(mesh):
    p = ConstrainedParam(jnp.ones((8, 4)), out_sharding=('data', 'model'))
    assert constraints_in(lambda p: p[...] * 2, p) == []
    assert jax.jit(lambda p: p[...] * 2)(p).sharding.spec == P('data', 'model')


class Tied(nnx.Module):
  def __init__(self, rngs):
    self.dense = nnx.Linear(4, 8, kernel_init=nnx.with_partitioning(init, (None, 'model')), rngs=rngs)
    self.norm = nnx.BatchNorm(8, rngs=rngs)
    self.tied = self.dense.kernel  # one parameter reached by two paths
    self.own = Custom(jnp.zeros(3))


class Custom(nnx.Param):
  pass


def test_constrain_params_at_use_keeps_values_metadata_sharing_and_other_types():
  with jax.set_mesh(auto_mesh()):
    model = Tied(nnx.Rngs(0))
    before = {p: (type(v), v.get_metadata(), np.asarray(v[...])) for p, v in nnx.to_flat_state(nnx.state(model))}
    constrained = constrain_params_at_use(model)
  after = dict(nnx.to_flat_state(nnx.state(constrained)))
  assert list(after) == list(before)
  for path, (kind, metadata, value) in before.items():
    new = after[path]
    expected = ConstrainedParam if kind is nnx.Param else kind
    assert type(new) is expected, path
    assert new.get_metadata() == metadata, path
    np.testing.assert_array_equal(np.asarray(new[...]), value)
  assert constrained.tied is constrained.dense.kernel
  assert isinstance(constrained.norm.mean, nnx.BatchStat)
  assert type(constrained.own) is Custom


def test_gradient_takes_the_parameter_sharding_as_linen_gives_it():
  """Linen's box constrains the kernel where it is read: its gradient is sharded as
  the kernel. A constrained NNX kernel compiles to the same program; a plain one
  leaves the gradient's sharding to XLA."""
  mesh = auto_mesh()
  kernel_init = nn.with_partitioning(init, ('data', 'model'))
  linen = nn.Dense(24, use_bias=False, kernel_init=kernel_init)
  with jax.set_mesh(mesh):
    x = jax.device_put(jnp.ones((4, 24)), NamedSharding(mesh, P()))
    abstract = jax.eval_shape(linen.init, jax.random.key(0), x)
    variables = jax.jit(linen.init, out_shardings=nn.get_sharding(abstract, mesh))(jax.random.key(0), x)
    plain = nnx.Linear(24, 24, use_bias=False, kernel_init=nnx.with_partitioning(init, ('data', 'model')), rngs=nnx.Rngs(0))
    plain.kernel[...] = nn.unbox(variables)['params']['kernel']
    constrained = constrain_params_at_use(plain)

    def linen_loss(params, x):
      return jnp.sum(linen.apply({'params': params}, x) ** 2)

    def nnx_loss(model, x):
      return jnp.sum(model(x) ** 2)

    grad_linen = jax.jit(jax.grad(linen_loss))
    grad_nnx = jax.jit(nnx.grad(nnx_loss))
    grad_linen, linen_program = compile_with_program(grad_linen, variables['params'], x)
    grad_constrained, constrained_program = compile_with_program(grad_nnx, constrained, x)
    assert constrained_program == linen_program
    # Why the helper exists: read unconstrained, the kernel's gradient is
    # computed otherwise (if a JAX release makes this pass, say so in docs/concepts/exactness.md).
    assert compile_with_program(grad_nnx, plain, x)[1] != linen_program
    g_linen = grad_linen(variables['params'], x)['kernel'].value
    g_constrained = grad_constrained(constrained, x).kernel[...]
    assert g_constrained.sharding.is_equivalent_to(g_linen.sharding, 2)
    assert np.asarray(g_constrained).tobytes() == np.asarray(g_linen).tobytes()
