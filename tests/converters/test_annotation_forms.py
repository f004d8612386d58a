"""Tests of the conversions on annotations as real Flax code writes them.

A Linen attention projection written as Flax writes it (`nn.DenseGeneral`: a
rank-3 kernel carrying the two logical names of the flat kernel, a bare bias
beside it, rules from `nn.logical_axis_rules(...)` around init and use) and
its NNX port in the three idioms ports use: logical names with
`sharding_rules` metadata, logical names resolved by the same context
manager, and names already resolved to mesh axes. Every idiom converts both
ways; a target in another idiom is filled when the annotations resolve to the
same `PartitionSpec`, and the output takes the target's form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import AxisType, PartitionSpec as P

import converters
from converters import errors

EMBED, HEADS, HEAD_DIM = 16, 4, 8
RULES = (('batch', 'data'), ('embed', None), ('heads', 'model'), ('kv', None))
MESH = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
INIT = nn.initializers.lecun_normal()
X = jnp.linspace(-1.0, 1.0, 2 * EMBED).reshape(2, EMBED)


class LinenProjection(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.DenseGeneral(
        (HEADS, HEAD_DIM),
        kernel_init=nn.with_logical_partitioning(INIT, ('embed', 'heads')),
        name='query',
    )(x)


IDIOMS = {
    'sharding_rules': dict(out_sharding=('embed', 'heads'), sharding_rules=RULES),
    'context_rules': dict(out_sharding=('embed', 'heads')),
    'mesh_axes': dict(out_sharding=(None, 'model')),
}


class NNXProjection(nnx.Module):
  def __init__(self, idiom: str, rngs: nnx.Rngs):
    self.query = nnx.LinearGeneral(
        EMBED, (HEADS, HEAD_DIM), kernel_init=nnx.with_metadata(INIT, **IDIOMS[idiom]), rngs=rngs
    )

  def __call__(self, x):
    return self.query(x)


def in_context(fn):
  with jax.set_mesh(MESH), nn.logical_axis_rules(RULES):
    return fn()


def linen_variables():
  return in_context(lambda: LinenProjection().init(jax.random.key(0), X))


def bits(x) -> bytes:
  return np.asarray(x).tobytes()


def test_the_linen_original_is_written_as_flax_writes_it():
  kernel = linen_variables()['params']['query']['kernel']
  assert isinstance(kernel, nn.LogicallyPartitioned) and kernel.rules is None
  assert kernel.names == ('embed', 'heads') and kernel.value.shape == (EMBED, HEADS, HEAD_DIM)
  assert kernel.value.sharding.spec == P(None, 'model')
  assert not isinstance(linen_variables()['params']['query']['bias'], nn.Partitioned)


def test_without_a_target_logical_names_stay_logical_and_resolve_in_the_same_context():
  variables = linen_variables()
  state = in_context(lambda: converters.linen_to_nnx(variables))
  kernel = state['query']['kernel']
  assert kernel.get_metadata()['out_sharding'] == ('embed', 'heads')
  assert 'sharding_rules' not in kernel.get_metadata()  # the context supplies them, as in Linen
  assert kernel[...] is variables['params']['query']['kernel'].value
  spec = in_context(lambda: nnx.get_partition_spec(state))['query']['kernel']
  assert (spec.get_value() if isinstance(spec, nnx.Variable) else spec) == P(None, 'model')
  assert 'out_sharding' not in state['query']['bias'].get_metadata()  # bare stays bare


def test_rules_given_are_attached_context_rules_are_not():
  variables = linen_variables()
  with jax.set_mesh(MESH):
    state = converters.linen_to_nnx(variables, rules=RULES)
  assert state['query']['kernel'].get_metadata()['sharding_rules'] == RULES


@pytest.mark.parametrize('idiom', IDIOMS)
def test_each_idiom_target_is_filled_in_its_own_form_with_the_linen_arrays(idiom):
  variables = linen_variables()
  target = in_context(lambda: NNXProjection(idiom, nnx.Rngs(1)))
  model = in_context(lambda: converters.linen_to_nnx(variables, target=target))
  got, wanted = model.query.kernel.get_metadata(), target.query.kernel.get_metadata()
  assert got == wanted
  assert model.query.kernel[...] is variables['params']['query']['kernel'].value
  out = in_context(lambda: jax.jit(lambda m, x: m(x))(model, X))
  reference = in_context(lambda: jax.jit(LinenProjection().apply)(variables, X))
  np.testing.assert_array_equal(out, reference)


@pytest.mark.parametrize('idiom', IDIOMS)
def test_each_idiom_converts_to_linen_and_back_to_itself(idiom):
  model = in_context(lambda: NNXProjection(idiom, nnx.Rngs(1)))
  linen = in_context(lambda: converters.nnx_to_linen(model))
  kernel = linen['params']['query']['kernel']
  if idiom == 'mesh_axes':
    assert type(kernel) is nn.Partitioned and kernel.names == (None, 'model')
  else:
    assert type(kernel) is nn.LogicallyPartitioned and kernel.names == ('embed', 'heads')
    assert kernel.rules == (RULES if idiom == 'sharding_rules' else None)
  back = in_context(lambda: converters.linen_to_nnx(linen, target=model))
  for path, var in nnx.to_flat_state(nnx.state(model)):
    (other,) = [v for p, v in nnx.to_flat_state(nnx.state(back)) if p == path]
    assert other.get_metadata() == var.get_metadata() and bits(other[...]) == bits(var[...])


@pytest.mark.parametrize('idiom', IDIOMS)
def test_a_linen_train_state_target_takes_its_own_logical_form_from_any_idiom(idiom):
  tx = optax.adam(1e-3)
  variables = linen_variables()
  state = in_context(lambda: TrainState.create(apply_fn=None, params=variables['params'], tx=tx))
  model = in_context(lambda: NNXProjection(idiom, nnx.Rngs(1)))
  optimizer = in_context(lambda: nnx.Optimizer(model, tx, wrt=nnx.Param))
  back = in_context(lambda: converters.nnx_to_linen((model, optimizer), target=state))
  kernel = back.params['query']['kernel']
  assert type(kernel) is nn.LogicallyPartitioned and (kernel.names, kernel.rules) == (('embed', 'heads'), None)
  mu = back.opt_state[0].mu['query']['kernel']
  assert type(mu) is nn.LogicallyPartitioned and mu.names == ('embed', 'heads')
  assert bits(kernel.value) == bits(model.query.kernel[...])


def test_annotations_that_resolve_differently_are_refused_naming_the_path():
  class Port(NNXProjection):
    def __init__(self, rngs):
      nnx.Module.__init__(self)
      init = nnx.with_metadata(INIT, out_sharding=('model', None))
      self.query = nnx.LinearGeneral(EMBED, (HEADS, HEAD_DIM), kernel_init=init, rngs=rngs)

  target = in_context(lambda: Port(nnx.Rngs(1)))
  with pytest.raises(errors.AnnotationError, match=r"model/query/kernel: .*resolves to P\(None, 'model', None\), target .*resolving to P\('model', None, None\)"):
    in_context(lambda: converters.linen_to_nnx(linen_variables(), target=target))


def test_logical_names_without_any_rules_are_refused_with_how_to_give_them():
  variables = linen_variables()
  with jax.set_mesh(MESH):
    with pytest.raises(errors.AnnotationError, match=r"query/kernel: logical names \['embed', 'heads'\] have no rule .* nn.logical_axis_rules"):
      converters.linen_to_nnx(variables)


def test_strict_refuses_a_bare_bias_beside_a_boxed_kernel():
  with pytest.raises(errors.AnnotationError, match='bare arrays: query/bias'):
    in_context(lambda: converters.linen_to_nnx(linen_variables(), strict=True))


def test_rules_naming_a_name_twice_are_refused_where_linen_and_nnx_would_differ():
  twice = (('embed', 'model'), ('embed', None), ('heads', 'data'), ('batch', 'data'), ('kv', None))
  box = nn.LogicallyPartitioned(jax.ShapeDtypeStruct((EMBED, HEADS, HEAD_DIM), jnp.float32), ('embed', 'heads'))
  with jax.set_mesh(MESH), nn.logical_axis_rules(twice):
    with pytest.raises(errors.AnnotationError, match=r"q/kernel: the rules name \['embed'\] more than once, and Linen .*P\('model', 'data'\).* NNX .*P\(None, 'data'\)"):
      converters.linen_to_nnx({'params': {'q': {'kernel': box}}}, mesh=MESH)
  harmless = (('embed', None), ('embed', None)) + RULES[2:]
  with jax.set_mesh(MESH), nn.logical_axis_rules(harmless):
    converters.linen_to_nnx({'params': {'q': {'kernel': box}}}, mesh=MESH)


def test_rules_given_are_attached_to_a_target_form_that_carries_none():
  model = in_context(lambda: NNXProjection('mesh_axes', nnx.Rngs(1)))
  target = in_context(lambda: jax.eval_shape(LinenProjection().init, jax.random.key(0), X))
  with jax.set_mesh(MESH):
    linen = converters.nnx_to_linen(model, target=target, rules=RULES)
  kernel = linen['params']['query']['kernel']
  assert (kernel.names, kernel.rules) == (('embed', 'heads'), RULES)


def test_a_bare_array_placed_sharded_is_not_relaid_replicated():
  from jax.sharding import NamedSharding

  def layer(i):
    placed = jax.device_put(jnp.full((8, 4), float(i)), NamedSharding(MESH, P(None, 'model')))
    return {'kernel': placed}

  params = {'params': {'Block_0': layer(0), 'Block_1': layer(1)}}
  paths = converters.PathMapping([converters.PathRule(
      'Block_{i}/kernel', 'blocks/{i}/kernel', linen_stacked='Scan_0/kernel', nnx_stacked='blocks/kernel'
  )])
  with pytest.raises(errors.LayoutError, match=r"Scan_0/kernel: bare \(unannotated\) sources placed sharded, Block_0/kernel \(P\(None, 'model'\)\)"):
    converters.relayout(params, scan=True, paths=paths)
  kept = converters.linen_to_nnx(params, paths=paths)  # kept where it is: nothing moves
  assert kept['blocks'][0]['kernel'][...] is params['params']['Block_0']['kernel']


def test_bare_optimizer_moments_of_a_target_are_held_to_their_spec_as_parameters_are():
  tx = optax.adam(1e-3)
  variables = linen_variables()
  bare_params = nn.meta.unbox(variables['params'])
  # Moments of the bare params: replicated, and the kernel's converted moments are sharded.
  state = in_context(lambda: TrainState.create(apply_fn=None, params=variables['params'], tx=tx))
  target = state.replace(opt_state=tx.init(bare_params))
  model = in_context(lambda: NNXProjection('mesh_axes', nnx.Rngs(1)))
  optimizer = in_context(lambda: nnx.Optimizer(model, tx, wrt=nnx.Param))
  with pytest.raises(errors.AnnotationError, match=r'opt_state/0/mu/query/kernel: .*resolving to P\(None, None, None\)'):
    in_context(lambda: converters.nnx_to_linen((model, optimizer), target=target))
