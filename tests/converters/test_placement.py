"""Arrays placed otherwise than their annotations say (`placement=`).

A Linen model initialised the ordinary way (`model.init(rng, x)`, no
`out_shardings`, as Flax's lm1b test does) holds its arrays replicated on the
mesh of `jax.set_mesh`, or on one device without it, while its boxes ask for
shards. Without a target the conversion refuses them, folding a long list,
unless `placement='reshard'`; into a target they go to the target's
shardings.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import converters
from converters.errors import AnnotationError
from converters.paths import PathMapping, PathRule
from tests.helpers import mesh

LAYERS = 5
PATHS = PathMapping([
    PathRule('Dense_{i}/kernel', 'layers/{i}/kernel', nnx_stacked='stack/kernel'),
    PathRule('Dense_{i}/bias', 'layers/{i}/bias', nnx_stacked='stack/bias'),
])
SHARDED = P(None, 'model')


class Stack(nn.Module):
  @nn.compact
  def __call__(self, x):
    init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))
    for _ in range(LAYERS):
      x = nn.Dense(8, kernel_init=init)(x)
    return x


class StackPort(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, 'model'))
    self.layers = nnx.List([nnx.Linear(8, 8, kernel_init=init, rngs=rngs) for _ in range(LAYERS)])

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


def init(on_mesh: bool):
  """Variables as `model.init` gives them: replicated on the mesh, or on one device."""
  x = jnp.ones((2, 8))
  if not on_mesh:
    return Stack().init(jax.random.key(0), x)
  with jax.set_mesh(mesh()):
    return Stack().init(jax.random.key(0), x)


def kernel(variables, i=0):
  return variables['params'][f'Dense_{i}']['kernel'].value


def test_arrays_replicated_against_their_annotations_are_refused_in_one_folded_line():
  variables = init(on_mesh=True)
  assert kernel(variables).sharding.spec == P()
  with pytest.raises(AnnotationError) as e:
    converters.linen_to_nnx(variables, paths=PATHS)
  message = str(e.value)
  assert message.startswith(f'arrays placed against their annotations: {LAYERS} arrays, e.g. Dense_0/kernel')
  assert '; all replicated;' in message and 'Dense_4/kernel is placed' not in message
  assert "placement='reshard'" in message
  assert set(e.value.paths) == {f'Dense_{i}/kernel' for i in range(LAYERS)}


@pytest.mark.parametrize('scan', [None, True], ids=['kept', 'stacked'])
def test_reshard_puts_each_array_where_its_annotation_says_and_leaves_the_input(scan):
  variables = init(on_mesh=True)
  before = jax.tree.map(np.asarray, nn.unbox(variables))
  state = converters.linen_to_nnx(variables, paths=PATHS, placement='reshard', scan=scan)
  if scan:
    stacked = state['stack']['kernel'].get_value()
    assert stacked.sharding.spec == P(None, None, 'model')
    np.testing.assert_array_equal(stacked[3], before['params']['Dense_3']['kernel'])
  else:
    for i in range(LAYERS):
      value = state['layers'][i]['kernel'].get_value()
      assert value.sharding.is_equivalent_to(NamedSharding(mesh(), SHARDED), 2)
      np.testing.assert_array_equal(value, before['params'][f'Dense_{i}']['kernel'])
  # The input keeps its own arrays, placed as they were.
  assert kernel(variables).sharding.spec == P() and not kernel(variables).is_deleted()
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, nn.unbox(variables)), before)


@pytest.mark.parametrize('on_mesh', [True, False], ids=['replicated', 'one-device'])
@pytest.mark.parametrize('abstract', [True, False], ids=['abstract-target', 'real-target'])
def test_into_a_target_the_arrays_go_to_its_shardings(on_mesh, abstract):
  variables = init(on_mesh)
  with jax.set_mesh(mesh()):
    target = nnx.eval_shape(lambda: StackPort(nnx.Rngs(1))) if abstract else StackPort(nnx.Rngs(1))
  if abstract and not on_mesh:
    # The target's mesh is abstract and the input has none: the mesh is asked for.
    with pytest.raises(AnnotationError, match='lie on no mesh and none is given.*pass mesh='):
      converters.linen_to_nnx(variables, target=target, paths=PATHS)
    model = converters.linen_to_nnx(variables, target=target, paths=PATHS, mesh=mesh())
  else:
    model = converters.linen_to_nnx(variables, target=target, paths=PATHS)
  for i in range(LAYERS):
    value = model.layers[i].kernel[...]
    assert value.sharding.is_equivalent_to(NamedSharding(mesh(), SHARDED), 2)
    np.testing.assert_array_equal(value, np.asarray(kernel(variables, i)))
  x = jnp.arange(16.0).reshape(2, 8)
  np.testing.assert_array_equal(model(x), Stack().apply(variables, x))


def test_an_nnx_model_made_replicated_goes_to_its_linen_targets_shardings():
  with jax.set_mesh(mesh()), nnx.use_eager_sharding(False):
    port = StackPort(nnx.Rngs(0))
  port = jax.tree.map(lambda x: x, port)
  with jax.set_mesh(mesh()):
    target = jax.eval_shape(lambda: Stack().init(jax.random.key(0), jnp.ones((2, 8))))
    variables = converters.nnx_to_linen(port, target=target, paths=PATHS)
  value = kernel(variables, 2)
  assert value.sharding.is_equivalent_to(NamedSharding(mesh(), SHARDED), 2)
  np.testing.assert_array_equal(value, np.asarray(port.layers[2].kernel[...]))


def test_reshard_with_no_mesh_anywhere_says_to_give_one():
  variables = init(on_mesh=False)
  with pytest.raises(AnnotationError, match=r"lie on no mesh and none is given: Dense_0/kernel.*pass mesh="):
    converters.linen_to_nnx(variables, paths=PATHS, placement='reshard')
  state = converters.linen_to_nnx(variables, paths=PATHS, placement='reshard', mesh=mesh())
  assert state['layers'][0]['kernel'].get_value().sharding.spec == SHARDED


def test_check_keeps_arrays_that_lie_on_no_mesh_where_they_are():
  state = converters.linen_to_nnx(init(on_mesh=False), paths=PATHS)
  assert not isinstance(state['layers'][0]['kernel'].get_value().sharding, NamedSharding)


@pytest.mark.parametrize('placement', ['move', True, 'RESHARD', '', 0])
def test_an_unknown_placement_is_refused(placement):
  with pytest.raises(AnnotationError, match=r"placement=.*pass 'check'.*or 'reshard'"):
    converters.linen_to_nnx(init(on_mesh=False), paths=PATHS, placement=placement)


# -- Flax's lm1b: the Linen model initialised as its test does, into the maintainers' NNX port

LM1B_RULES = (('embed', 'fsdp'), ('mlp', 'tensor'), ('kv', 'tensor'), ('vocab', 'tensor'))
LM1B_SIZE = dict(vocab_size=64, output_vocab_size=64, emb_dim=32, num_heads=4, num_layers=2,
                 qkv_dim=32, mlp_dim=64, max_len=16)


@functools.cache
def lm1b_mesh():
  return jax.make_mesh((1, 2, 4), ('data', 'fsdp', 'tensor'), axis_types=(AxisType.Auto,) * 3)


def lm1b_port():
  from tests.third_party.flax_lm1b import nnx_config, nnx_models

  rules = nnx_config.MeshRules(**dict(LM1B_RULES))  # the example's default config
  port = nnx_models.TransformerLM(
      nnx_models.TransformerConfig(**LM1B_SIZE, axis_rules=rules), rngs=nnx.Rngs(0)
  )
  port.set_attributes(deterministic=True, decode=False)  # as Flax's models_test runs it
  return port


# Nightly; CI: unsharded Linen values into a sharded target
# (test_into_a_target_the_arrays_go_to_its_shardings); lm1b whole-model proofs are nightly
@pytest.mark.nightly
@pytest.mark.parametrize('on_mesh', [False, True], ids=['one-device', 'replicated'])
def test_flax_lm1b_initialised_unsharded_converts_into_its_nnx_ports_sharded_target(on_mesh):
  from tests.third_party.flax_lm1b import linen_models

  linen = linen_models.TransformerLM(linen_models.TransformerConfig(**LM1B_SIZE, deterministic=True))
  tokens = jax.random.randint(jax.random.key(1), (2, 8), 1, 64)
  if on_mesh:
    with jax.set_mesh(lm1b_mesh()):
      variables = linen.init(jax.random.key(0), tokens)
  else:
    variables = linen.init(jax.random.key(0), tokens)  # as Flax's lm1b train_test does
  with jax.set_mesh(lm1b_mesh()):
    target = nnx.eval_shape(lm1b_port)
    port = converters.linen_to_nnx(
        variables, target=target, paths='infer', rules=LM1B_RULES,
        linen_model=converters.LinenModel(linen, tokens), nnx_model=lm1b_port,
    )
  params = nn.unbox(variables['params'])['decoder']
  kernel = port.decoder.encoderdecoderblock_1.mlp.linear1.kernel[...]
  assert kernel.sharding.is_equivalent_to(NamedSharding(lm1b_mesh(), P('fsdp', 'tensor')), 2)
  np.testing.assert_array_equal(kernel, params['encoderdecoderblock_1']['MlpBlock_0']['Dense_0']['kernel'])
  embedding = port.decoder.output_embed.embedding[...]
  assert embedding.sharding.is_equivalent_to(NamedSharding(lm1b_mesh(), P('tensor', 'fsdp')), 2)
  np.testing.assert_array_equal(embedding, params['Embed_0']['embedding'])
  with jax.set_mesh(lm1b_mesh()):
    logits = port(tokens)
  # Two programs (the port's attention and masks are its own ops, sharded
  # here, on one device there): equal within Flax's own models_test tolerance.
  np.testing.assert_allclose(logits, linen.apply(variables, tokens), rtol=0, atol=1e-5)


def test_a_bare_array_on_the_mesh_keeps_its_sharding_into_a_target():
  """A bare array says nothing against where it is: it is not gathered."""
  sharded = NamedSharding(mesh(), SHARDED)
  variables = jax.tree.map(
      lambda x: jax.device_put(x, sharded) if x.ndim == 2 else x, nn.unbox(init(on_mesh=False))
  )
  model = converters.linen_to_nnx(variables, target=_bare_port(), paths=PATHS)
  assert model.layers[0].kernel[...].sharding.is_equivalent_to(sharded, 2)


def _bare_port():
  with jax.set_mesh(mesh()):
    return nnx.eval_shape(lambda: _BarePort(nnx.Rngs(1)))


class _BarePort(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(LAYERS)])


def test_reshard_asked_into_a_target_is_the_default_into_it():
  variables = init(on_mesh=False)
  with jax.set_mesh(mesh()):
    target = StackPort(nnx.Rngs(1))
  for placement in (None, 'reshard'):
    model = converters.linen_to_nnx(variables, target=target, paths=PATHS, placement=placement)
    assert model.layers[0].kernel[...].sharding.is_equivalent_to(NamedSharding(mesh(), SHARDED), 2)
