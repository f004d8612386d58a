"""Checkpoints of users' models: every model-zoo pair, through `convert_checkpoint`.

Each pair is described as a user describes it (`zoo_models`: factories, path
mapping, rules, optax transform). A Linen training loop written like Flax's
examples trains k steps and saves its `TrainState` with Orbax; the checkpoint
converts to NNX with `linen-nnx convert --linen-model ... --nnx-model ...`
(the command line's `main`, in this process); the NNX port restores it with
its ordinary restore (`nnx.get_abstract_model` and Orbax), trains j steps and
saves; that converts back to Linen, whose ordinary restore must give what
k + j Linen steps give: bit for bit where both sides compile to the same
program, and within the zoo-port tests' stated tolerance for the LSTM's
fused-gate port. Training is deterministic (dropout streams differ between
the frameworks).
"""

from __future__ import annotations

import os

import flax
import flax.training.dynamic_scale
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import checkpoints as flax_checkpoints
from jax.sharding import NamedSharding, PartitionSpec as P

from converters import LinenModel, convert_checkpoint, compare_checkpoints
from converters.checkpoint.convert import CheckpointOptions
from linen_nnx_cli.kit_models import models_for
from converters.checkpoint.models import UserModels, train_state_class
from converters.errors import CheckpointError, PathMappingError, ShapeError
from model_zoo.linen import resnet as linen_resnet
from model_zoo.nnx import resnet as nnx_resnet
from tests.converters.checkpoint import zoo_models as zoo
from tests.converters.checkpoint.fixtures import tree_checksum
from tests.converters.test_zoo_ports import FUSED_CELL_TRAINING_ATOL
from tests.helpers import in_mesh, mesh


def classification_loss(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def lm_loss(logits, tokens):
  return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def image_batches(config, count, seed):
  size = getattr(config, 'image_size', 8)
  return [
      {
          'image': jax.random.normal(jax.random.key(seed + i), (4, size, size, config.in_channels)),
          'label': jax.random.randint(jax.random.key(seed + 100 + i), (4,), 0, config.num_classes),
      }
      for i in range(count)
  ]


def token_batches(vocab_size, count, seed):
  return [jax.random.randint(jax.random.key(seed + i), (2, 8), 0, vocab_size) for i in range(count)]


# Each pair's steps, as a Flax example writes them: the Linen step on a
# `TrainState`, the NNX step on the model and its `nnx.Optimizer`.
def classifier_steps(linen_kwargs):
  @jax.jit
  def linen_step(state, batch):
    def loss(params):
      logits = state.apply_fn({'params': params}, batch['image'], **linen_kwargs)
      return classification_loss(logits, batch['label'])
    return state.apply_gradients(grads=jax.grad(loss)(state.params))

  @nnx.jit
  def nnx_step(model, optimizer, batch):
    model.eval()
    grads = nnx.grad(lambda m: classification_loss(m(batch['image']), batch['label']))(model)
    optimizer.update(model, grads)

  return linen_step, nnx_step


def lm_steps():
  @jax.jit
  def linen_step(state, tokens):
    grads = jax.grad(lambda p: lm_loss(state.apply_fn({'params': p}, tokens), tokens))(state.params)
    return state.apply_gradients(grads=grads)

  @nnx.jit
  def nnx_step(model, optimizer, tokens):
    model.eval()
    optimizer.update(model, nnx.grad(lambda m: lm_loss(m(tokens), tokens))(model))

  return linen_step, nnx_step


def resnet_steps():
  linen_step = jax.jit(lambda state, batch: linen_resnet.train_step(state, batch)[0])

  @nnx.jit
  def nnx_step(model, optimizer, batch):
    nnx_resnet.train_step(model, optimizer, batch)

  return linen_step, nnx_step


def cli_options(name: str) -> list[str]:
  """The command line's model options of a pair, naming `zoo_models`' objects."""
  pair, module = PAIRS[name], zoo.__name__
  spec = lambda obj: f'{module}:{obj.__name__}'
  options = [
      '--linen-model', spec(pair['linen']), '--nnx-model', spec(pair['nnx']),
      '--paths', f'{module}:{pair["paths_name"]}', '--optimizer', spec(zoo.make_tx),
  ]
  if pair['rules'] is not None:
    options += ['--rules', f'{module}:TRANSFORMER_RULES']
  return options


def linen_nnx(*args) -> int:
  from linen_nnx_cli import main as cli

  return cli.main([str(a) for a in args])


PAIRS = {
    'cnn': dict(
        linen=zoo.linen_cnn, nnx=zoo.nnx_cnn, paths=zoo.CNN_PATHS, paths_name='CNN_PATHS',
        rules=None,
        steps=lambda: classifier_steps({'train': False}),
        batches=lambda: image_batches(zoo.CNN, 4, 10), atol=0.0,
    ),
    'resnet': dict(
        linen=zoo.linen_resnet, nnx=zoo.nnx_resnet, paths=zoo.RESNET_PATHS,
        paths_name='RESNET_PATHS', rules=None,
        steps=resnet_steps, batches=lambda: image_batches(zoo.RESNET, 4, 20), atol=0.0,
    ),
    'lstm-fused-cell': dict(
        linen=zoo.linen_rnn, nnx=zoo.nnx_rnn, paths=zoo.RNN_PATHS, paths_name='RNN_PATHS',
        rules=None,
        steps=lm_steps, batches=lambda: token_batches(zoo.RNN.vocab_size, 4, 30),
        atol=FUSED_CELL_TRAINING_ATOL,
    ),
    'transformer': dict(
        linen=zoo.linen_transformer, nnx=zoo.nnx_transformer, paths=zoo.TRANSFORMER_PATHS,
        paths_name='TRANSFORMER_PATHS',
        rules=zoo.TRANSFORMER_RULES, steps=lm_steps,
        batches=lambda: token_batches(64, 4, 40), atol=0.0,
    ),
}


def models_of(pair, optimizer=zoo.make_tx) -> dict:
  return dict(
      linen_model=pair['linen'], nnx_model=pair['nnx'], paths=pair['paths'],
      rules=pair['rules'], optimizer=optimizer,
  )


def linen_train_state(pair, tx, layout=None):
  """A new Linen `TrainState` of the pair's model, as a Flax example creates it."""
  model = pair['linen']() if layout is None else pair['linen'](layout=layout)
  concrete = [
      jax.numpy.zeros(a.shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a
      for a in model.args
  ]
  variables = dict(model.module.init(jax.random.key(0), *concrete, **model.kwargs))
  params = variables.pop('params')
  if variables:  # batch_stats: the ResNet's own TrainState, as Flax's ImageNet example
    return linen_resnet.TrainState.create(
        apply_fn=model.module.apply, params=params, tx=tx, **variables
    )
  return flax.training.train_state.TrainState.create(
      apply_fn=model.module.apply, params=params, tx=tx
  )


def save(path, state):
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.fspath(path), state)


def restore_like(path, like):
  """The ordinary Orbax restore into the structure and shardings of `like`."""
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
  )
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(os.fspath(path), target)


def nnx_restore(path, factory, tx):
  """The NNX port's ordinary restore (Flax 0.12's guide): the abstract model and
  optimizer with their shardings (`nnx.get_abstract_model`), Orbax; returns the
  model and its optimizer. Call under the rules the model is annotated with."""

  def create():
    model = factory()
    return {'model': model, 'optimizer': nnx.Optimizer(model, tx, wrt=nnx.Param)}

  graphdef, target = nnx.get_abstract_model(create, mesh())
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(os.fspath(path), target)
  objects = nnx.merge(graphdef, restored)
  return objects['model'], objects['optimizer']


def assert_states_equal(expected, actual, atol):
  flat_e = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(expected))[0]
  flat_a = dict(jax.tree_util.tree_flatten_with_path(nn.meta.unbox(actual))[0])
  assert len(flat_e) == len(flat_a)
  for path, e in flat_e:
    a = flat_a[path]
    e, a = np.asarray(e), np.asarray(a)
    assert e.shape == a.shape and e.dtype == a.dtype, path
    if atol == 0.0 or not np.issubdtype(e.dtype, np.floating):
      np.testing.assert_array_equal(e, a, err_msg=jax.tree_util.keystr(path))
    else:
      np.testing.assert_allclose(e, a, rtol=0, atol=atol, err_msg=jax.tree_util.keystr(path))


# Nightly, a whole-model run whose parts CI checks: the LSTM's fused cell
# through users' models (`test_flax_training_checkpoints_of_every_pair_convert`'s
# lstm-fused-cell case), training on in NNX and back bit for bit
# (test_zoo_ports.py::test_lstm_trains_on_in_the_fused_cell_exactly), a converted
# checkpoint training on (port/test_training.py::test_a_converted_checkpoint_trains_on_as_in_linen)
# and NNX -> Linen with users' models (test_hostile_models.py).
@pytest.mark.nightly
@pytest.mark.parametrize('name', list(PAIRS))
def test_linen_checkpoint_trains_on_in_nnx_and_comes_back(tmp_path, name):
  """k Linen steps, save, convert, NNX restore + j steps, save, convert back = k + j steps."""
  pair, k, j = PAIRS[name], 2, 2
  linen_step, nnx_step = pair['steps']()
  batches = pair['batches']()
  with in_mesh(pair['rules']):
    state = linen_train_state(pair, zoo.make_tx())
    for batch in batches[:k]:
      state = linen_step(state, batch)
  save(tmp_path / 'linen', state)
  before = tree_checksum(tmp_path / 'linen')

  options = cli_options(name)
  assert linen_nnx('convert', tmp_path / 'linen', tmp_path / 'nnx', '--to', 'nnx', *options) == 0
  assert tree_checksum(tmp_path / 'linen') == before
  with in_mesh(pair['rules']):
    model, optimizer = nnx_restore(tmp_path / 'nnx', pair['nnx'], zoo.make_tx())
    for batch in batches[k:k + j]:
      nnx_step(model, optimizer, batch)
    save(tmp_path / 'nnx_trained', nnx.state({'model': model, 'optimizer': optimizer}))
    for batch in batches[k:k + j]:
      state = linen_step(state, batch)

  back_path = tmp_path / 'back'
  assert linen_nnx('convert', tmp_path / 'nnx_trained', back_path, '--to', 'linen', *options) == 0
  with in_mesh(pair['rules']):
    back = restore_like(tmp_path / 'back', state)
  assert int(back.step) == k + j
  assert_states_equal(state.params, back.params, pair['atol'])
  assert_states_equal(state.opt_state, back.opt_state, pair['atol'])
  if hasattr(state, 'batch_stats'):
    assert_states_equal(state.batch_stats, back.batch_stats, pair['atol'])


# Nightly; CI: every framework pair and layout in test_convert's restores with
# the other side's ordinary code, the zoo transformer relaid out in test_streaming
# and test_weights.
@pytest.mark.nightly
@pytest.mark.parametrize('to', ['nnx', 'linen'])
def test_transformer_scan_and_loop_in_all_four_framework_pairs(tmp_path, to):
  """Linen loop -> `to` scan -> NNX loop -> Linen loop: with both values of
  `to`, every framework pair converts, and what comes back is what was saved."""
  pair = PAIRS['transformer']
  with in_mesh(pair['rules']):
    state = linen_train_state(pair, zoo.make_tx(), layout='loop')
    state = pair['steps']()[0](state, pair['batches']()[0])
  save(tmp_path / 'loop', state)
  models = models_of(pair)
  summary = convert_checkpoint(
      tmp_path / 'loop', tmp_path / 'scan', to, models=models_for(**models), layout='scan',
  )
  assert (summary['source']['layout'], summary['destination']['layout']) == ('loop', 'scan')
  summary = convert_checkpoint(
      tmp_path / 'scan', tmp_path / 'nnx', 'nnx', models=models_for(**models), layout='loop',
  )
  assert (summary['source']['framework'], summary['source']['layout']) == (to, 'scan')
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models_for(**models))
  with in_mesh(pair['rules']):
    back = restore_like(tmp_path / 'back', state)
  assert_states_equal(state.params, back.params, 0.0)
  assert_states_equal(state.opt_state, back.opt_state, 0.0)


# The legacy msgpack files (read on the host, then placed) of every pair but
# the transformer, whose layers the Orbax round trips above cover (CI time);
# Orbax's format, which flax.training.checkpoints writes by default, is the
# one every pair's round trip reads, so one pair covers its directory.
# CI runs the first case only (CI_EVERY_NTH), the LSTM's: a msgpack directory
# of steps, its newest converted, every leaf compared, through rules that
# reshape (its fused gates). Nightly, the CNN's and the ResNet's, other models
# of the same claim (the ResNet's batch statistics convert in CI in
# test_zoo_ports.py::test_resnet_train_state_with_batch_stats_trains_on_in_nnx_exactly),
# and the Orbax directory as before (both of Flax's forms read in CI by
# test_inspect.py::test_flax_training_checkpoints_are_read_into_shardings).
_MSGPACK_PAIRS = ['lstm-fused-cell', 'cnn', 'resnet']


@pytest.mark.parametrize(
    'name, use_orbax',
    [(name, False) for name in _MSGPACK_PAIRS] + [('cnn', True)],
    ids=[f'{name}-flax-msgpack' for name in _MSGPACK_PAIRS] + ['cnn-flax-orbax'],
)
def test_flax_training_checkpoints_of_every_pair_convert(tmp_path, name, use_orbax):
  """`flax.training.checkpoints` directories, as Flax's examples save them
  every few steps: the newest step converts, and every leaf is what the
  Linen state held."""
  pair = PAIRS[name]
  linen_step = pair['steps']()[0]
  with in_mesh(pair['rules']):
    state = linen_train_state(pair, zoo.make_sgd())
    # Placed as the steps return it: a Python-int step would compile the step twice.
    state = jax.device_put(state, NamedSharding(mesh(), P()))
  previous = flax.config.flax_use_orbax_checkpointing
  flax.config.update('flax_use_orbax_checkpointing', use_orbax)
  try:
    for step, batch in enumerate(pair['batches']()[:2], start=1):
      with in_mesh(pair['rules']):
        state = linen_step(state, batch)
      flax_checkpoints.save_checkpoint(str(tmp_path / 'checkpoints'), state, step=step, keep=3)
  finally:
    flax.config.update('flax_use_orbax_checkpointing', previous)
  options = [o if o != f'{zoo.__name__}:make_tx' else f'{zoo.__name__}:make_sgd' for o in cli_options(name)]
  assert linen_nnx('convert', tmp_path / 'checkpoints', tmp_path / 'nnx', '--to', 'nnx', *options) == 0
  models = models_of(pair, optimizer=zoo.make_sgd)
  rows, _, summary = compare_checkpoints(
      tmp_path / 'checkpoints', tmp_path / 'nnx', models=models_for(**models),
  )
  assert summary['a']['format'] == ('orbax' if use_orbax else 'flax-msgpack')
  assert rows and all(r.identical for r in rows), [r for r in rows if not r.identical]
  with in_mesh(pair['rules']):
    _, optimizer = nnx_restore(tmp_path / 'nnx', pair['nnx'], zoo.make_sgd())
  assert int(optimizer.step[...]) == 2  # the newest step


# Nightly; CI: test_compare.py (compare_checkpoints and compare_outputs of users' models),
# test_main_checkpoints.py::test_compare_checkpoints_identical_and_different (a model of layers, its
# rows paired across frameworks) and test_streaming.py's transformer converted by the checkpoint tool.
@pytest.mark.nightly
def test_compare_of_a_users_linen_and_nnx_checkpoints(tmp_path):
  pair = PAIRS['transformer']
  with in_mesh(pair['rules']):
    state = linen_train_state(pair, zoo.make_tx())
    state = pair['steps']()[0](state, pair['batches']()[0])
  save(tmp_path / 'linen', state)
  models = models_of(pair)
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models_for(**models))
  rows, labels, _ = compare_checkpoints(
      tmp_path / 'linen', tmp_path / 'nnx', models=models_for(**models),
  )
  assert labels == ('Linen', 'NNX') and all(r.identical for r in rows)
  by_path = {r.linen_path: r.nnx_path for r in rows}
  assert by_path['params/Block_1/attention/query/kernel'] == 'model/blocks/1/attention/query/kernel'
  assert by_path['opt_state/0/mu/Block_0/mlp/Dense_0/kernel'] == (
      'optimizer/opt_state/0/mu/blocks/0/mlp/up/kernel'
  )


# -- structure mismatches, before anything is read -----------------------------


def linen_checkpoint_of(tmp_path, pair, tx=None):
  with in_mesh(pair['rules']):
    state = linen_train_state(pair, tx or zoo.make_tx())
  save(tmp_path / 'src', state)
  return tmp_path / 'src'


@pytest.mark.nightly  # CI: test_inspect.py::test_wrong_structure_lists_every_difference (the message), test_a_port_of_another_width_is_refused_leaf_by_leaf_before_reading (users' models)
def test_a_model_of_another_size_is_refused_leaf_by_leaf(tmp_path):
  src = linen_checkpoint_of(tmp_path, PAIRS['cnn'])
  wider = zoo.CNNConfig(hidden=32)
  models = models_of(PAIRS['cnn']) | dict(
      linen_model=LinenModel(
          zoo.linen_cnn_module.CNN(wider), zoo.images(wider), train=False
      ),
  )
  with pytest.raises(CheckpointError) as e:
    convert_checkpoint(src, tmp_path / 'dst', 'nnx', models=models_for(**models))
  message = str(e.value)
  assert 'does not hold the linen training state of the Linen model (CNN)' in message
  assert 'params/Dense_0/kernel (32, 16) float32 (expected (32, 32) float32)' in message
  assert 'opt_state/0/mu/Dense_0/kernel' in message  # the optimizer's leaves too
  assert not os.path.exists(tmp_path / 'dst')


def test_another_optimizer_is_refused_with_its_leaves(tmp_path):
  src = linen_checkpoint_of(tmp_path, PAIRS['cnn'], tx=zoo.make_sgd())
  with pytest.raises(CheckpointError, match=r'missing \[.*opt_state/.*unexpected \[.*trace'):
    convert_checkpoint(src, tmp_path / 'dst', 'nnx', models=models_for(**models_of(PAIRS['cnn'])))


def forbid_reading(monkeypatch) -> None:
  """Fails the test if a conversion reads array data (either path) before refusing."""
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint.orbax_files import SourceCheckpoint

  def fail(*args, **kwargs):
    pytest.fail('read before refusing')

  monkeypatch.setattr(checkpoints, 'restore', fail)
  for method in ('open', 'read', 'read_chunks'):
    monkeypatch.setattr(SourceCheckpoint, method, fail)


def test_a_mapping_that_leaves_parameters_unmapped_is_refused_before_reading(tmp_path, monkeypatch):
  src = linen_checkpoint_of(tmp_path, PAIRS['cnn'])
  forbid_reading(monkeypatch)
  partial = zoo.PathMapping([r for r in zoo.CNN_PATHS.rules if 'Dense_1' not in r.linen])
  with pytest.raises(PathMappingError, match='no rule maps these linen paths: .*Dense_1/kernel'):
    convert_checkpoint(
        src, tmp_path / 'dst', 'nnx',
        models=models_for(**models_of(PAIRS['cnn']) | {'paths': partial}),
    )


def test_a_port_of_another_width_is_refused_leaf_by_leaf_before_reading(tmp_path, monkeypatch):
  src = linen_checkpoint_of(tmp_path, PAIRS['cnn'])
  forbid_reading(monkeypatch)
  wider = zoo.CNNConfig(hidden=32)
  models = models_of(PAIRS['cnn']) | dict(nnx_model=lambda: zoo.nnx_cnn_module.CNN(wider, rngs=nnx.Rngs(0)))
  with pytest.raises(ShapeError) as e:
    convert_checkpoint(src, tmp_path / 'dst', 'nnx', models=models_for(**models))
  # The hidden layer's kernel and bias, the head's kernel, and adam's two moments of each.
  assert str(e.value).startswith('9 leaves do not fit the target: ')
  listed = {
      prefix + path
      for path in ('hidden/kernel', 'hidden/bias', 'logits/kernel')
      for prefix in ('model/', 'optimizer/opt_state/0/mu/', 'optimizer/opt_state/0/nu/')
  }
  assert set(e.value.paths) == listed
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_a_missing_rule_is_named_on_both_sides_before_reading(tmp_path, monkeypatch):
  src = linen_checkpoint_of(tmp_path, PAIRS['cnn'])
  forbid_reading(monkeypatch)
  partial = zoo.PathMapping([r for r in zoo.CNN_PATHS.rules if 'Dense_1' not in r.linen])
  with pytest.raises(PathMappingError) as e:
    convert_checkpoint(
        src, tmp_path / 'nnx', 'nnx',
        models=models_for(**models_of(PAIRS['cnn']) | {'paths': partial}),
    )
  assert 'no rule maps these linen paths: Dense_1/bias, Dense_1/kernel' in str(e.value)
  assert 'and no rule maps these nnx paths of the target: logits/bias, logits/kernel' in str(e.value)
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_options_of_a_users_models_are_checked(tmp_path):
  src = linen_checkpoint_of(tmp_path, PAIRS['cnn'])
  models = models_of(PAIRS['cnn'])
  with pytest.raises(CheckpointError, match='linen_model= is given without nnx_model='):
    convert_checkpoint(src, tmp_path / 'dst', 'nnx', models=models_for(linen_model=zoo.linen_cnn))
  with pytest.raises(CheckpointError, match="names one of the kit's optimizers"):
    convert_checkpoint(
        src, tmp_path / 'dst', 'nnx', models=models_for(**models | {'optimizer': 'adam'}),
    )
  with pytest.raises(CheckpointError, match='the optimizer is not given'):
    convert_checkpoint(
        src, tmp_path / 'dst', 'nnx', models=models_for(**models | {'optimizer': None}),
    )
  with pytest.raises(CheckpointError, match='makes one layout only'):
    convert_checkpoint(src, tmp_path / 'dst', 'nnx', models=models_for(**models), layout='scan')
  with pytest.raises(CheckpointError, match=r'mesh 3x3 needs 9 devices'):
    convert_checkpoint(
        src, tmp_path / 'dst', 'nnx', models=models_for(mesh_shape=(3, 3), **models),
    )
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_train_state_class_is_one_class_per_field_set():
  assert train_state_class(()) is flax.training.train_state.TrainState
  cls = train_state_class(('batch_stats',))
  assert cls is train_state_class(('batch_stats',))
  assert 'batch_stats' in {f.name for f in __import__('dataclasses').fields(cls)}


def test_user_models_sides_carry_the_annotations_shardings():
  models = UserModels(
      zoo.linen_transformer, zoo.nnx_transformer, zoo.TRANSFORMER_PATHS,
      zoo.TRANSFORMER_RULES, zoo.make_tx,
  )
  linen = models.side('linen', mesh(), 'scan')
  nnx_side = models.side('nnx', mesh(), 'loop')
  assert (linen.layout, nnx_side.layout) == ('scan', 'loop')
  kernel = linen.abstract_state.params['ScanCheckpointBlock_0']['mlp']['Dense_0']['kernel']
  assert kernel.names == ('layers', 'embed', 'mlp')
  assert tuple(kernel.value.sharding.spec) == (None, None, 'model')  # layers, embed unsharded


def test_a_state_saved_before_its_first_step_converts(tmp_path):
  """`TrainState.create` leaves `step` a Python int, which Orbax stores as int64."""
  from converters.checkpoint import inspect as checkpoints

  src = linen_checkpoint_of(tmp_path, PAIRS['cnn'])
  assert checkpoints.inspect(src).leaves[('step',)] == ((), 'int64')
  summary = convert_checkpoint(
      src, tmp_path / 'dst', 'nnx', models=models_for(**models_of(PAIRS['cnn'])),
  )
  assert summary['step'] == 0 and summary['verified']


def test_nnx_rng_streams_are_kept_within_nnx_and_seeded_from_linen(tmp_path):
  """Linen has no RNG state: a Linen source seeds the NNX target's streams
  (and says so); an NNX source keeps its keys and counts."""
  pair = PAIRS['cnn']
  src = linen_checkpoint_of(tmp_path, pair)
  models = models_of(pair)
  first = convert_checkpoint(
      src, tmp_path / 'nnx', 'nnx', models=models_for(**models), options=CheckpointOptions(seed=7),
  )
  assert first['rng_state']['kept'] == []
  assert first['rng_state']['seeded'] == ['model/dropout/rngs/count', 'model/dropout/rngs/key']
  # A key the seed cannot give, so keeping it is told from seeding it again.
  with in_mesh(None):
    model, optimizer = nnx_restore(tmp_path / 'nnx', pair['nnx'], zoo.make_tx())
    model.dropout.rngs.key.set_value(jax.random.key(12345))
    count = int(model.dropout.rngs.count[...]) + 3
    model.dropout.rngs.count.set_value(model.dropout.rngs.count[...] + 3)
    save(tmp_path / 'nnx_used', nnx.state({'model': model, 'optimizer': optimizer}))
  again = convert_checkpoint(
      tmp_path / 'nnx_used', tmp_path / 'nnx_again', 'nnx', models=models_for(**models),
      options=CheckpointOptions(seed=7),
  )
  assert again['rng_state']['seeded'] == [] and len(again['rng_state']['kept']) == 2
  with in_mesh(None):
    model, _ = nnx_restore(tmp_path / 'nnx_again', pair['nnx'], zoo.make_tx())
  np.testing.assert_array_equal(
      jax.random.key_data(model.dropout.rngs.key[...]), jax.random.key_data(jax.random.key(12345))
  )
  assert int(model.dropout.rngs.count[...]) == count


class ImageNetTrainState(flax.training.train_state.TrainState):
  """Flax's ImageNet example's `TrainState`: `dynamic_scale` is None unless in half precision."""

  batch_stats: object
  dynamic_scale: flax.training.dynamic_scale.DynamicScale


# Nightly; CI: test_hostile_models.py::test_a_train_state_class_of_the_users_own_converts_both_ways_and_restores_as_that_class
# (the same class, on a small model with batch statistics).
@pytest.mark.nightly
def test_a_train_state_class_of_the_users_own_with_fields_beyond_collections(tmp_path):
  pair = PAIRS['resnet']
  with in_mesh(None):
    state = linen_train_state(pair, zoo.make_tx())
    state = ImageNetTrainState.create(
        apply_fn=state.apply_fn, params=state.params, tx=state.tx,
        batch_stats=state.batch_stats, dynamic_scale=None,
    )
    state = pair['steps']()[0](state, pair['batches']()[0])
  save(tmp_path / 'src', state)
  linen = pair['linen']()
  models = models_of(pair) | {'linen_model': LinenModel(
      linen.module, *linen.args, train_state=ImageNetTrainState, **linen.kwargs
  )}
  convert_checkpoint(tmp_path / 'src', tmp_path / 'nnx', 'nnx', models=models_for(**models))
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models_for(**models))
  with in_mesh(None):
    back = restore_like(tmp_path / 'back', state)
  assert isinstance(back, ImageNetTrainState) and back.dynamic_scale is None
  assert_states_equal(state.batch_stats, back.batch_stats, 0.0)
