"""The claims of the side-by-side page (`linen_nnx_cli.side_by_side.CONCEPTS`), run on the installed Flax.

One test per claim, named `test_<claim name>`; `test_side_by_side` checks that
every claim has its test and every test here a claim. Each runs the behaviour
the claim states, small, so that a Flax or JAX upgrade that changes it fails
here and the page is corrected before it misleads anyone. Where an older
wording of the page was wrong, the test checks what happens instead.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from kit_mlp.description import FSDP_RULES, ModelDescription
from linen_impl.train import make_trainer as linen_trainer
from model_zoo import configs
from model_zoo.linen import cnn as linen_cnn, mlp as linen_mlp, resnet as linen_resnet, transformer as linen_transformer
from model_zoo.nnx import cnn as nnx_cnn, mlp as nnx_mlp, resnet as nnx_resnet, transformer as nnx_transformer
from nnx_impl.train import make_trainer as nnx_trainer
from nnx_port.constrained_params import ConstrainedParam
from tests import helpers

#: `('batch', 'embed')` both to 'data', 'batch' first, as the FSDP rules do.
RULES = (('batch', 'data'), ('embed', 'data'))
INIT = nn.initializers.lecun_normal()


@pytest.fixture(scope='module')
def mesh():
  return helpers.mesh()


def _spec(var: nnx.Variable) -> P:
  return nnx.get_partition_spec(nnx.State({'v': var}))['v'].get_value()


# -- Annotating parameters ---------------------------------------------------------


def test_linen_init_returns_boxes():
  dense = nn.Dense(8, kernel_init=nn.with_partitioning(INIT, (None, 'model')))
  kernel = dense.init(jax.random.key(0), jnp.ones((2, 4)))['params']['kernel']
  assert isinstance(kernel, nn.Partitioned)
  assert kernel.names == (None, 'model') and kernel.value.shape == (4, 8)


def test_nnx_annotation_is_out_sharding_metadata(mesh):
  with jax.set_mesh(mesh):
    by_partitioning = nnx.Linear(4, 8, kernel_init=nnx.with_partitioning(INIT, (None, 'model')), rngs=nnx.Rngs(0))
    by_metadata = nnx.Linear(4, 8, kernel_init=nnx.with_metadata(INIT, out_sharding=(None, 'model')), rngs=nnx.Rngs(0))
    by_keyword = nnx.Param(jnp.zeros((4, 8)), out_sharding=(None, 'model'))
    for kernel in (by_partitioning.kernel, by_metadata.kernel, by_keyword):
      assert kernel.get_metadata()['out_sharding'] == (None, 'model')
    for old in ('sharding', 'sharding_names'):
      with pytest.warns(DeprecationWarning):
        legacy = nnx.Param(jnp.zeros((4, 8)), **{old: (None, 'model')})
      assert legacy.get_metadata()['out_sharding'] == (None, 'model')


def test_linen_boxes_constrain_at_use(mesh):
  x = jnp.ones((2, 8))
  boxed = {'kernel': nn.Partitioned(jnp.ones((8, 8)), (None, 'model'))}
  apply = lambda p: nn.Dense(8, use_bias=False).apply({'params': p}, x)
  assert 'sharding_constraint' not in str(jax.make_jaxpr(apply)(boxed))  # no mesh, no constraint
  with jax.set_mesh(mesh):
    assert 'sharding_constraint' in str(jax.make_jaxpr(apply)(boxed))
    annotated = nnx.Param(jnp.ones((8, 8)), out_sharding=(None, 'model'))
    constrained = ConstrainedParam(jnp.ones((8, 8)), out_sharding=(None, 'model'))
    read = lambda v: x @ v[...]
    assert 'sharding_constraint' not in str(jax.make_jaxpr(read)(annotated))
    assert 'sharding_constraint' in str(jax.make_jaxpr(read)(constrained))


# -- Logical names and rules -------------------------------------------------------


def test_linen_logical_boxes_carry_rules():
  with_rules = nn.with_logical_partitioning(INIT, ('embed', None), rules=RULES)(jax.random.key(0), (4, 4))
  without = nn.with_logical_partitioning(INIT, ('embed', None))(jax.random.key(0), (4, 4))
  assert isinstance(with_rules, nn.LogicallyPartitioned)
  assert with_rules.rules == RULES and without.rules is None


def test_nnx_sharding_rules_metadata(mesh):
  with jax.set_mesh(mesh):
    direct = nnx.Linear(8, 8, kernel_init=nnx.with_partitioning(INIT, ('embed', None), sharding_rules=RULES), rngs=nnx.Rngs(0))
    by_metadata = nnx.Linear(
        8, 8, kernel_init=nnx.with_metadata(INIT, out_sharding=('embed', None), sharding_rules=RULES), rngs=nnx.Rngs(0)
    )
  for key in ('out_sharding', 'sharding_rules'):
    assert direct.kernel.get_metadata()[key] == by_metadata.kernel.get_metadata()[key]
  assert _spec(direct.kernel) == P('data', None)
  # `nn.logical_to_mesh_sharding` of the Linen names is NNX's named sharding.
  linen = nn.logical_to_mesh_sharding(P('embed', None), mesh, RULES)
  nnx_sharding = nnx.get_named_sharding(nnx.State({'k': direct.kernel}), mesh)['k'].get_value()
  assert linen == nnx_sharding


def test_nnx_merges_rules_with_the_context(mesh):
  with jax.set_mesh(mesh), nn.logical_axis_rules((('hidden', 'model'),)):
    merged = nnx.Param(jnp.zeros((8, 8)), out_sharding=('embed', 'hidden'), sharding_rules=RULES)
    assert _spec(merged) == P('data', 'model')
  assert nnx.logical_axis_rules is nn.logical_axis_rules
  with jax.set_mesh(mesh), nn.logical_axis_rules((('embed', 'model'),)):
    with pytest.raises(ValueError, match='Inconsistent logical axis annotations for embed'):
      nnx.Param(jnp.zeros((8, 8)), out_sharding=('embed', None), sharding_rules=RULES)


# -- Activation constraints --------------------------------------------------------


def test_nnx_has_no_logical_constraint():
  assert hasattr(nn, 'with_logical_constraint')
  assert not any('logical_constraint' in name for name in dir(nnx))
  desc = ModelDescription(annotation='logical', rules=FSDP_RULES)
  assert desc.resolve(('embed', 'batch')) == tuple(nn.logical_to_mesh_axes(('embed', 'batch'), FSDP_RULES))


def test_linen_first_rule_to_claim_a_free_axis_wins():
  # The page once said that a mesh axis already used by an earlier dimension is
  # dropped, which would give P('data', None) here.
  assert nn.logical_to_mesh_axes(('embed', 'batch'), RULES) == P(None, 'data')
  assert nn.logical_to_mesh_axes(('batch', 'embed'), RULES) == P('data', None)


def test_nnx_keeps_a_repeated_mesh_axis(mesh):
  assert nn.logical_to_mesh_axes(('batch', 'embed'), RULES) == P('data', None)
  var = nnx.Param(jnp.zeros((8, 8)), out_sharding=('batch', 'embed'), sharding_rules=RULES, eager_sharding=False)
  assert _spec(var) == P('data', 'data')
  with jax.set_mesh(mesh), pytest.raises(Exception, match='duplicate entries'):  # JAX's DuplicateSpecError
    nnx.Param(jnp.zeros((8, 8)), out_sharding=('batch', 'embed'), sharding_rules=RULES)
  unruled = nnx.Param(jnp.zeros((8, 8)), out_sharding=('model', 'embed'), sharding_rules=RULES, eager_sharding=False)
  assert _spec(unruled) == P('model', 'data')
  # Linen falls back to a later rule when the first one's axis is taken; NNX keeps the last rule.
  fallbacks = (('embed', 'data'), ('embed', None))
  assert nn.logical_to_mesh_axes(('embed',), fallbacks) == P('data')
  var = nnx.Param(jnp.zeros((8,)), out_sharding=('embed',), sharding_rules=fallbacks, eager_sharding=False)
  assert _spec(var) == P(None)


# -- Scanned vs looped layers ------------------------------------------------------


class _Layer(nn.Module):
  @nn.compact
  def __call__(self, x, _=None):
    return nn.Dense(4, kernel_init=nn.with_partitioning(INIT, (None, 'model')))(x), None


def _stacked_nnx(mesh, transform_metadata):
  with jax.set_mesh(mesh):
    @nnx.split_rngs(splits=3)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata=transform_metadata)
    def create(rngs):
      return nnx.Linear(4, 4, kernel_init=nnx.with_partitioning(INIT, (None, 'model')), rngs=rngs)

    return create(nnx.Rngs(0))


@pytest.mark.nightly  # CI: model_zoo/test_transformer.py::test_scanned_parameters_carry_the_layers_axis_on_both_sides
def test_both_insert_the_layer_axis_name_first(mesh):
  scanned = nn.scan(
      _Layer, length=3, variable_axes={'params': 0}, split_rngs={'params': True},
      metadata_params={nn.PARTITION_NAME: 'layers'},
  )()
  with jax.set_mesh(mesh):
    kernel = scanned.init(jax.random.key(0), jnp.ones((2, 4)))['params']['Dense_0']['kernel']
  assert kernel.names == ('layers', None, 'model') and kernel.value.shape == (3, 4, 4)
  stacked = _stacked_nnx(mesh, {nnx.PARTITION_NAME: 'layers'})
  assert stacked.kernel.shape == (3, 4, 4)
  assert stacked.kernel.get_metadata()['out_sharding'] == ('layers', None, 'model')


def test_nnx_vmap_without_transform_metadata_keeps_stale_names(mesh):
  stacked = _stacked_nnx(mesh, {})
  assert stacked.kernel.shape == (3, 4, 4)
  assert stacked.kernel.get_metadata()['out_sharding'] == (None, 'model')


def test_nnx_layer_lists_need_nnx_list_or_nnx_data():
  class Looped(nnx.Module):
    def __init__(self, wrap, rngs):
      self.layers = wrap([nnx.Linear(2, 2, rngs=rngs) for _ in range(2)])

  for wrap in (nnx.List, nnx.data):
    state = nnx.state(Looped(wrap, nnx.Rngs(0)), nnx.Param)
    assert {path[:2] for path, _ in nnx.to_flat_state(state)} == {('layers', 0), ('layers', 1)}
  with pytest.raises(ValueError, match='nnx.List|nnx.data'):
    Looped(list, nnx.Rngs(0))
  desc = ModelDescription(num_layers=2, depth=16, batch=8)
  linen = linen_trainer(desc, desc.make_mesh(), optax.sgd(0.1))
  assert set(linen.abstract_state.params) == {'DotReluDot_0', 'DotReluDot_1'}


# -- Sharded creation --------------------------------------------------------------


def test_linen_shards_init_from_the_boxes(mesh):
  model = nn.Dense(8, kernel_init=nn.with_partitioning(INIT, (None, 'model')))
  x = jnp.ones((2, 8))
  with jax.set_mesh(mesh):
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    shardings = nn.get_sharding(abstract, mesh)
    variables = jax.jit(model.init, out_shardings=shardings)(jax.random.key(0), x)
  assert shardings['params']['kernel'] == NamedSharding(mesh, P(None, 'model'))
  assert variables['params']['kernel'].value.sharding.spec == P(None, 'model')


def test_nnx_shards_variables_when_created(mesh):
  init = nnx.with_partitioning(INIT, (None, 'model'))
  with jax.set_mesh(mesh):
    eager = nnx.Linear(8, 8, kernel_init=init, rngs=nnx.Rngs(0))
    jitted = nnx.jit(lambda: nnx.Linear(8, 8, kernel_init=init, rngs=nnx.Rngs(0)))()
  for layer in (eager, jitted):
    assert layer.kernel[...].sharding == NamedSharding(mesh, P(None, 'model'))
  with pytest.raises(ValueError, match='mesh context'):
    nnx.Linear(8, 8, kernel_init=init, rngs=nnx.Rngs(0))
  # Turned off, creation needs no mesh and leaves the array where it was made.
  with nnx.use_eager_sharding(False):
    lazy = nnx.Linear(8, 8, kernel_init=init, rngs=nnx.Rngs(0))
  assert len(lazy.kernel[...].sharding.device_set) == 1


def test_nnx_vmap_does_not_apply_the_layer_axis(mesh):
  @nnx.jit
  def create():
    @nnx.split_rngs(splits=2)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: 'data'})
    def create_layers(rngs):
      return nnx.Linear(8, 8, kernel_init=nnx.with_partitioning(INIT, (None, 'model')), rngs=rngs)

    return create_layers(nnx.Rngs(0))

  with jax.set_mesh(mesh):
    layers = create()
  assert layers.kernel.get_metadata()['out_sharding'] == ('data', None, 'model')
  assert not layers.kernel[...].sharding.is_equivalent_to(NamedSharding(mesh, P('data', None, 'model')), 3)
  # The kit's scanned MLP is constrained: its stacked kernels are where their names say.
  desc = ModelDescription(num_layers=2, depth=16, batch=8, use_scan=True, layer_partition='data')
  trainer = nnx_trainer(desc, desc.make_mesh(), 'adam')
  with jax.set_mesh(trainer.mesh):
    kernel = trainer.create()['model']['layers']['dot1']['kernel']
  assert kernel.sharding.is_equivalent_to(NamedSharding(trainer.mesh, P('data', None, 'model')), 3)


def test_get_abstract_model_is_a_restore_target(mesh):
  create = lambda: nnx.Linear(8, 8, kernel_init=nnx.with_partitioning(INIT, (None, 'model')), rngs=nnx.Rngs(0))
  graphdef, abstract = nnx.get_abstract_model(create, mesh)
  kernel = abstract['kernel'].get_value()
  assert isinstance(kernel, jax.ShapeDtypeStruct) and kernel.shape == (8, 8)
  assert kernel.sharding == NamedSharding(mesh, P(None, 'model'))
  with jax.set_mesh(mesh):
    model = nnx.merge(graphdef, jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), abstract))
  assert isinstance(model, nnx.Linear)


def test_make_mesh_axes_are_explicit_by_default():
  mesh = jax.make_mesh((2, 4), ('data', 'model'), devices=jax.devices()[:8])
  assert mesh.axis_types == (AxisType.Explicit,) * 2
  x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P()))
  with jax.set_mesh(mesh):
    with pytest.raises(AssertionError, match='Explicit'):
      jax.jit(lambda y: jax.lax.with_sharding_constraint(y, P('data', None)))(x)
  auto = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:8])
  with jax.set_mesh(auto):
    y = jax.jit(lambda y: jax.lax.with_sharding_constraint(y, P('data', None)))(x)
  assert y.sharding.is_equivalent_to(NamedSharding(auto, P('data', None)), 2)
  with warnings.catch_warnings():
    warnings.simplefilter('error', DeprecationWarning)
    with pytest.raises(DeprecationWarning):
      with auto:
        pass
  assert ModelDescription().make_mesh().axis_types == (AxisType.Auto,) * 2  # the kit's


# -- Optimizer state ---------------------------------------------------------------


def test_linen_optax_state_is_boxed():
  desc = ModelDescription(num_layers=1, depth=16, batch=8)
  trainer = linen_trainer(desc, desc.make_mesh(), optax.adam(1e-3))
  mu = trainer.abstract_state.opt_state[0].mu
  boxes = jax.tree.leaves(mu, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert boxes and all(isinstance(b, nn.Partitioned) for b in boxes)
  assert jax.tree.structure(mu, is_leaf=lambda x: isinstance(x, nn.Partitioned)) == jax.tree.structure(
      trainer.abstract_state.params, is_leaf=lambda x: isinstance(x, nn.Partitioned)
  )


@pytest.mark.nightly  # CI: nnx_impl/test_train.py::test_every_param_and_moment_is_sharded_as_annotated (every moment placed as its param)
def test_nnx_optimizer_copies_param_metadata(mesh):
  with jax.set_mesh(mesh):
    model = nnx.Linear(8, 8, kernel_init=nnx.with_partitioning(INIT, (None, 'model')), rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    mu = optimizer.opt_state[0].mu['kernel']
    assert mu.get_metadata()['out_sharding'] == (None, 'model')
    assert mu[...].sharding == NamedSharding(mesh, P(None, 'model'))
    assert not hasattr(optimizer, 'model')
    before = model.kernel[...]
    grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((2, 8)))))(model)
    optimizer.update(model, grads)  # in place
    assert not np.array_equal(model.kernel[...], before)
  # Linen's `apply_gradients` returns a new state and leaves the old one be.
  dense = nn.Dense(2)
  params = dense.init(jax.random.key(0), jnp.ones((1, 2)))['params']
  state = train_state.TrainState.create(apply_fn=dense.apply, params=params, tx=optax.sgd(0.1))
  new = state.apply_gradients(grads=jax.tree.map(jnp.ones_like, state.params))
  assert new is not state and new.step == 1 and state.step == 0


# -- Train step --------------------------------------------------------------------


def test_nnx_modules_are_pytrees():
  model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  assert len(jax.tree.leaves(model)) == 2 and jax.tree.leaves(optimizer)
  x = jnp.ones((3, 2))
  loss = lambda m: jnp.sum(m(x) ** 2)
  value, grads = jax.value_and_grad(loss)(model)
  assert isinstance(grads, nnx.Linear) and value == loss(model)
  nnx_value, nnx_grads = nnx.value_and_grad(loss)(model)
  assert isinstance(nnx_grads, nnx.State) and nnx_value == value
  np.testing.assert_array_equal(grads.kernel[...], nnx_grads['kernel'][...])
  doubled = jax.jit(lambda m: m(x) * 2)(model)
  np.testing.assert_array_equal(doubled, model(x) * 2)
  _, ys = jax.lax.scan(lambda m, _: (m, m(x)), model, None, length=2)
  assert ys.shape == (2, 3, 2)
  # Differentiating the whole Module differentiates every leaf; with dropout's
  # RNG count among them JAX's transform fails where NNX's picks the Params.
  noisy = nnx.Sequential(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Dropout(0.5, rngs=nnx.Rngs(1)))
  with pytest.raises(TypeError):
    jax.value_and_grad(lambda m: jnp.sum(m(x)))(noisy)
  nnx.value_and_grad(lambda m: jnp.sum(m(x)))(noisy)
  # What changes inside a JAX transform comes out only in what it returns.
  count = lambda: noisy.layers[1].rngs.count[...]
  before = count()
  jax.jit(lambda m: m(x))(noisy)
  assert count() == before
  nnx.jit(lambda m: m(x))(noisy)
  assert count() == before + 1
  returned = jax.jit(lambda m: (m(x), m)[1])(noisy)
  assert returned.layers[1].rngs.count[...] == before + 2 and count() == before + 1
  # An Optimizer goes through `jax.jit` as well, and its step likewise.
  stepped = jax.jit(lambda o, m: (o.update(m, nnx.grad(loss)(m)), o)[1])(optimizer, model)
  assert stepped.step[...] == 1 and optimizer.step[...] == 0


def test_kit_step_merges_inside_the_trace():
  desc = ModelDescription(num_layers=1, depth=16, batch=8)
  trainer = nnx_trainer(desc, desc.make_mesh(), 'adam')
  with jax.set_mesh(trainer.mesh):
    arrays = trainer.create()
    traced = jax.make_jaxpr(trainer.train_step)(arrays, jnp.ones((8, 16)), jnp.ones((8, 16)))
  # Plain arrays in and out: a dict of arrays, no Variables, no graph.
  assert all(isinstance(a, jax.Array) for a in jax.tree.leaves(arrays))
  assert len(traced.in_avals) == len(jax.tree.leaves(arrays)) + 2


# -- Several steps -----------------------------------------------------------------


def test_nnx_scan_carries_the_model_and_optimizer():
  model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  xs = jnp.ones((3, 4, 2))

  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
  def steps(carry, x):
    model, optimizer = carry
    loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return carry, loss

  before = model.kernel[...]
  _, losses = steps((model, optimizer), xs)
  assert losses.shape == (3,) and optimizer.step[...] == 3
  assert not np.array_equal(model.kernel[...], before)


# -- Inference ---------------------------------------------------------------------


@pytest.mark.nightly  # CI: linen_impl/ and nnx_impl/test_train.py::test_output_is_sharded_data_none
def test_both_outputs_are_sharded_like_the_batch():
  desc = ModelDescription(num_layers=1, depth=16, batch=8)
  mesh = desc.make_mesh()
  linen, nnx_t = linen_trainer(desc, mesh, optax.sgd(0.1)), nnx_trainer(desc, mesh, 'adam')
  x = jnp.ones((8, 16))
  with jax.set_mesh(mesh):
    y_linen = linen.apply(linen.create().params, x)
    y_nnx = nnx_t.apply(nnx_t.create(), x)
  for y in (y_linen, y_nnx):
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P('data', None)), 2)


# -- Checkpoints -------------------------------------------------------------------


def test_orbax_restores_into_the_target_shardings(mesh, tmp_path):
  create = lambda: nnx.Linear(8, 8, kernel_init=nnx.with_partitioning(INIT, (None, 'model')), rngs=nnx.Rngs(0))
  with jax.set_mesh(mesh):
    state = nnx.state(create())
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'ckpt', state)
  _, abstract = nnx.get_abstract_model(create, mesh)
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / 'ckpt', abstract)
  assert restored['kernel'][...].sharding == NamedSharding(mesh, P(None, 'model'))
  np.testing.assert_array_equal(restored['kernel'][...], state['kernel'][...])


# -- Logical rules from the context (zoo) ------------------------------------------


def test_linen_rules_come_from_the_context():
  mesh = linen_transformer.make_mesh()
  assert mesh.axis_types == (AxisType.Auto,) * 2
  config = configs.TransformerConfig()
  tokens = jnp.zeros((2, 8), jnp.int32)
  model = linen_transformer.TransformerLM(config)
  boxed = jax.eval_shape(model.init, jax.random.key(0), tokens)['params']['embed']['embedding']
  assert isinstance(boxed, nn.LogicallyPartitioned) and boxed.rules is None
  assert boxed.names == ('vocab', 'embed')
  variables = linen_transformer.create_sharded(model, mesh, tokens)
  expected = P(*nn.logical_to_mesh_axes(('vocab', 'embed'), configs.RULES))
  assert expected == P('model', None)
  assert variables['params']['embed']['embedding'].value.sharding.is_equivalent_to(NamedSharding(mesh, expected), 2)


def test_nnx_context_rules_resolve_at_creation(mesh):
  config = configs.TransformerConfig()
  expected = NamedSharding(mesh, P(*nn.logical_to_mesh_axes(('vocab', 'embed'), configs.RULES)))
  for idiom in nnx_transformer.IDIOMS:
    model = nnx_transformer.create_sharded(config, mesh, idiom)
    assert model.embed.embedding[...].sharding.is_equivalent_to(expected, 2), idiom
  # Without the rules in context the logical names are taken for mesh axes.
  with jax.set_mesh(mesh), pytest.raises(ValueError, match='vocab'):
    nnx_transformer.TransformerLM(config, idiom='context_rules', rngs=nnx.Rngs(0))


@pytest.fixture(scope='module')
def explicit_mesh():
  mesh = nnx_transformer.make_mesh(axis_type=AxisType.Explicit)
  assert mesh.axis_types == (AxisType.Explicit,) * 2
  return mesh


def test_linen_needs_auto_mesh_axes(mesh, explicit_mesh):
  model = linen_transformer.TransformerLM(configs.TransformerConfig())
  tokens = jnp.zeros((2, 8), jnp.int32)
  with pytest.raises(AssertionError, match='Explicit'):
    linen_transformer.create_sharded(model, explicit_mesh, tokens)
  linen_transformer.create_sharded(model, mesh, tokens)


def test_nnx_creates_on_explicit_mesh_axes(explicit_mesh):
  config = configs.TransformerConfig()
  model = nnx_transformer.create_sharded(config, explicit_mesh, 'rules_metadata')
  expected = P(*nn.logical_to_mesh_axes(('vocab', 'embed'), configs.RULES))
  assert model.embed.embedding[...].sharding.is_equivalent_to(NamedSharding(explicit_mesh, expected), 2)
  # JAX's ShardingTypeError is not public; its message names the fix.
  with jax.set_mesh(explicit_mesh), pytest.raises(Exception, match='gather.*out_sharding|out_sharding.*gather'):
    model(jnp.zeros((2, 8), jnp.int32))


# -- Dropout, train() and eval(), RNG streams (zoo) ----------------------------------


CNN = configs.CNNConfig()
IMAGES = jnp.ones((2, CNN.image_size, CNN.image_size, CNN.in_channels))


def test_linen_dropout_needs_a_dropout_rng():
  model, variables = linen_cnn.create(CNN, IMAGES)
  with pytest.raises(Exception, match='dropout'):
    model.apply(variables, IMAGES, train=True)
  once = linen_cnn.train_logits(model, variables, IMAGES, jax.random.key(1))
  again = linen_cnn.train_logits(model, variables, IMAGES, jax.random.key(1))
  other = linen_cnn.train_logits(model, variables, IMAGES, jax.random.key(2))
  np.testing.assert_array_equal(once, again)
  assert not np.array_equal(once, other)


def test_nnx_train_and_eval_set_every_dropout(mesh):
  model = nnx_cnn.create(CNN)
  assert not model.dropout.deterministic  # a new model trains
  model.eval()
  assert model.dropout.deterministic
  np.testing.assert_array_equal(model(IMAGES), model(IMAGES))
  # A view in the other mode leaves the model as it was.
  nnx_cnn.train_logits(model, IMAGES)
  assert model.dropout.deterministic
  model.train()
  assert not model.dropout.deterministic
  # Every submodule: the transformer has a dozen Dropouts and an attention.
  transformer = nnx_transformer.create_sharded(configs.TransformerConfig(), mesh, 'rules_metadata')
  dropouts = [m for _, m in nnx.iter_modules(transformer) if isinstance(m, nnx.Dropout)]
  assert len(dropouts) > 2 and not any(d.deterministic for d in dropouts)
  transformer.eval()
  assert all(d.deterministic for d in dropouts)
  train = inspect.signature(linen_transformer.TransformerLM.__call__).parameters['train']
  assert train.default is False  # Linen's original is off by default


def test_nnx_dropout_draws_from_its_rngs_stream():
  model = nnx_cnn.create(CNN, seed=0)
  counts = nnx.state(model, nnx.RngCount)
  assert [path for path, _ in nnx.to_flat_state(counts)] == [('dropout', 'rngs', 'count')]
  first, second = nnx_cnn.train_logits(model, IMAGES), nnx_cnn.train_logits(model, IMAGES)
  assert not np.array_equal(first, second)
  assert nnx.state(model, nnx.RngCount)['dropout']['rngs']['count'][...] == 2
  # The same dropout seed gives the same masks; another, others.
  np.testing.assert_array_equal(nnx_cnn.train_logits(nnx_cnn.create(CNN, seed=0), IMAGES), first)
  other = nnx_cnn.CNN(CNN, rngs=nnx.Rngs(params=0, dropout=5))
  assert not np.array_equal(nnx_cnn.train_logits(other, IMAGES), first)


def test_nnx_layers_are_created_with_their_input_sizes():
  with pytest.raises(TypeError):
    nnx.Linear(4, rngs=nnx.Rngs(0))  # out_features alone is Linen's nn.Dense(4)
  assert nnx.Linear(3, 4, rngs=nnx.Rngs(0)).kernel.shape == (3, 4)
  assert nn.Dense(4).init(jax.random.key(0), jnp.ones((1, 3)))['params']['kernel'].shape == (3, 4)


# -- BatchNorm (zoo) ---------------------------------------------------------------


RESNET = configs.ResNetConfig()
RESNET_IMAGES = jax.random.normal(jax.random.key(0), (2, 8, 8, RESNET.in_channels))


def test_linen_batch_stats_need_mutable():
  model = linen_resnet.ResNet(RESNET)
  variables = model.init(jax.random.key(0), RESNET_IMAGES, train=False)
  assert set(variables) == {'params', 'batch_stats'}
  with pytest.raises(Exception, match='batch_stats'):
    model.apply(variables, RESNET_IMAGES, train=True)
  _, updates = model.apply(variables, RESNET_IMAGES, train=True, mutable=['batch_stats'])
  old, new = variables['batch_stats']['bn_init']['mean'], updates['batch_stats']['bn_init']['mean']
  assert not np.array_equal(old, new)
  # In evaluation the running averages are read, not written: no `mutable` needed.
  model.apply(variables, RESNET_IMAGES, train=False)


def test_nnx_batch_stats_update_in_place():
  model = nnx_resnet.ResNet(RESNET, rngs=nnx.Rngs(0))
  assert isinstance(model.bn_init.mean, nnx.BatchStat)
  before = model.bn_init.mean[...]
  model.train()
  model(RESNET_IMAGES)
  trained = model.bn_init.mean[...]
  assert not np.array_equal(trained, before)
  model.eval()
  model(RESNET_IMAGES)
  np.testing.assert_array_equal(model.bn_init.mean[...], trained)


# Nightly; CI: the zoo ResNet's nnx.value_and_grad train step (test_zoo_ports, batch stats compared)
@pytest.mark.nightly
def test_nnx_value_and_grad_keeps_batch_stat_updates():
  model = nnx_resnet.ResNet(RESNET, rngs=nnx.Rngs(0))
  model.train()
  before = model.bn_init.mean[...]
  _, grads = nnx.value_and_grad(lambda m: jnp.mean(m(RESNET_IMAGES)))(model)
  assert {type(v) for _, v in nnx.to_flat_state(grads)} == {nnx.Param}
  updated = model.bn_init.mean[...]
  assert not np.array_equal(updated, before)
  # The zoo's step, with its optimizer: the statistics move on again.
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  nnx_resnet.train_step(model, optimizer, {'image': RESNET_IMAGES, 'label': jnp.zeros((2,), jnp.int32)})
  assert not np.array_equal(model.bn_init.mean[...], updated)


# -- Decode caches (zoo) -----------------------------------------------------------


@pytest.mark.nightly  # CI: model_zoo/test_transformer.py's decoding tests apply Linen with mutable=['cache']
def test_linen_cache_collection_needs_mutable(mesh):
  config = configs.TransformerConfig()
  model = linen_transformer.TransformerLM(config, decode=True)
  with jax.set_mesh(mesh), nn.logical_axis_rules(configs.RULES):
    # Jitted, as decoding runs (eagerly, each operation is dispatched to the
    # mesh's devices one by one); Linen refuses at trace time.
    variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((2, config.max_len), jnp.int32))
    assert 'cache' in variables
    token = jnp.zeros((2, 1), jnp.int32)
    with pytest.raises(Exception, match='cache'):
      jax.jit(model.apply)(variables, token)
    _, updates = jax.jit(functools.partial(model.apply, mutable=['cache']))(variables, token)
  assert updates['cache']['pos_embed']['cache_index'] == 1


@pytest.mark.nightly  # model_zoo's decoding test (cache_index after three jitted calls)
def test_nnx_cache_variables_update_in_place(mesh):
  config = configs.TransformerConfig()
  with jax.set_mesh(mesh):
    model = nnx_transformer.TransformerLM(config, rngs=nnx.Rngs(0))
    model.eval()
    model.init_cache(2)
    assert isinstance(model.pos_embed.cache_index, nnx.Cache)
    model(jnp.zeros((2, 1), jnp.int32), decode=True)
    model(jnp.zeros((2, 1), jnp.int32), decode=True)
  assert model.pos_embed.cache_index[...] == 2
  assert all(b.attention.cache_index[...] == 2 for b in model.blocks)


# -- Scanned blocks with remat (zoo) -------------------------------------------------


def test_remat_keeps_values_and_gradients():
  x = jnp.ones((2, 4))
  layer = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
  plain = lambda m: jnp.sum(jnp.sin(m(x)))
  remat = lambda m: jnp.sum(jnp.sin(nnx.remat(lambda m: m(x))(m)))
  value, grads = nnx.value_and_grad(plain)(layer)
  remat_value, remat_grads = nnx.value_and_grad(remat)(layer)
  assert value == remat_value
  np.testing.assert_array_equal(grads['kernel'][...], remat_grads['kernel'][...])
  # The remat primitive (its name varies across JAX versions; its parameters do not).
  assert 'prevent_cse' in str(jax.make_jaxpr(nnx.grad(remat))(layer))
  assert 'prevent_cse' not in str(jax.make_jaxpr(nnx.grad(plain))(layer))
  dense = nn.Dense(4)
  params = dense.init(jax.random.key(0), x)
  remat_dense = nn.remat(nn.Dense)(4)
  assert 'prevent_cse' in str(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(remat_dense.apply(p, x))))(params))
  linen_plain = jax.grad(lambda p: jnp.sum(jnp.sin(dense.apply(p, x))))(params)
  linen_remat = jax.grad(lambda p: jnp.sum(jnp.sin(remat_dense.apply(p, x))))(params)
  np.testing.assert_array_equal(linen_plain['params']['kernel'], linen_remat['params']['kernel'])


@pytest.mark.nightly  # model_zoo's scanned decoding test (stacked caches' shapes)
def test_linen_scan_stacks_listed_collections(mesh):
  config = configs.TransformerConfig(scan_layers=True)
  with jax.set_mesh(mesh), nn.logical_axis_rules(configs.RULES):
    linen = linen_transformer.TransformerLM(config, decode=True).init(
        jax.random.key(0), jnp.zeros((2, config.max_len), jnp.int32)
    )
    model = nnx_transformer.TransformerLM(config, rngs=nnx.Rngs(0))
    model.init_cache(2)
  linen_key = linen['cache']['ScanCheckpointBlock_0']['attention']['cached_key']
  assert linen_key.shape[0] == config.num_layers
  assert model.blocks.attention.cached_key.shape[0] == config.num_layers
  assert model.blocks.attention.cached_key.shape == linen_key.shape


# -- Sown intermediates (zoo) --------------------------------------------------------


def test_linen_sow_needs_mutable_intermediates():
  model = linen_mlp.SowingMLP(hidden=4, num_classes=2)
  x = jnp.ones((2, 3))
  variables = model.init(jax.random.key(0), x)
  assert set(variables) == {'params'}
  _, state = model.apply(variables, x, mutable=['intermediates'])
  (features,) = state['intermediates']['features']
  assert features.shape == (2, 4)
  assert not isinstance(model.apply(variables, x), tuple)  # nothing recorded, nothing returned
  logits, hidden = linen_mlp.hidden_activations(model, variables, x)
  np.testing.assert_array_equal(hidden, features)


def test_nnx_capture_collects_sown_values():
  model = nnx_mlp.SowingMLP(3, 4, 2, rngs=nnx.Rngs(0))
  x = jnp.ones((2, 3))
  before = nnx.state(model)
  with warnings.catch_warnings():
    warnings.simplefilter('error', DeprecationWarning)
    logits, hidden = nnx_mlp.hidden_activations(model, x)
  assert hidden.shape == (2, 4) and logits.shape == (2, 2)
  assert jax.tree.structure(nnx.state(model)) == jax.tree.structure(before)
  with pytest.warns(DeprecationWarning, match='capture'):
    model(x)
  stored = nnx.pop(model, nnx.Intermediate)
  assert stored['features'].get_value()[0].shape == (2, 4)


# -- Porting one module at a time: nnx.bridge (zoo) ----------------------------------


def test_bridge_to_linen_puts_nnx_params_in_the_linen_tree():
  model = linen_mlp.BridgedMLP(in_features=3, hidden=4, num_classes=2)
  x = jnp.ones((2, 3))
  variables = model.init(jax.random.key(0), x)
  assert variables['params']['hidden']['kernel'].shape == (3, 4)
  expected = jax.nn.relu(x @ variables['params']['hidden']['kernel'] + variables['params']['hidden']['bias'])
  expected = expected @ variables['params']['logits']['kernel'] + variables['params']['logits']['bias']
  np.testing.assert_allclose(model.apply(variables, x), expected, rtol=1e-6)


def test_bridge_to_nnx_needs_lazy_init():
  bare = nnx_mlp.BridgedMLP(4, 2, rngs=nnx.Rngs(0))
  assert ('hidden', 'kernel') not in dict(nnx.to_flat_state(nnx.state(bare, nnx.Param)))
  model = nnx_mlp.create_bridged(3, 4, 2, rngs=nnx.Rngs(0))
  params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  assert params[('hidden', 'kernel')].shape == (3, 4)
  rng_state = [path for path, _ in nnx.to_flat_state(nnx.state(model, nnx.RngState))]
  assert rng_state and all(path[:2] == ('hidden', 'to_nnx__rngs') for path in rng_state)
  assert model(jnp.ones((2, 3))).shape == (2, 2)
