"""The checkpoint tool on users' models it must not mishandle, found by an adversarial pass.

A counter too large for the target's integer dtype, an optimizer with no
state or with hyperparameters in its state, NNX RNG state in `compare`, a
write that fails (a full disk), factories that raise, annotations the mesh
cannot resolve, a collection of the model's own, and tuple-keyed collection
paths (Flax's `SpectralNorm`). Models:
`small_models`, a user's module.
"""

from __future__ import annotations

import errno
import os

import flax
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import checkpoints as flax_checkpoints
from flax.training import train_state

import converters
from converters import LinenModel, compare_checkpoints, convert_checkpoint
from converters.checkpoint.convert import CheckpointOptions
from linen_nnx_cli.kit_models import models_for
from converters.checkpoint.models import UserModels, train_state_class
from converters.errors import CheckpointError, ShapeError, StructureError
from tests.converters.checkpoint import small_models as small
from tests.converters.checkpoint import test_models as zoo_tests
from tests.converters.checkpoint import zoo_models as zoo

MLP = dict(linen_model=small.linen_mlp, nnx_model=small.nnx_mlp, paths=small.PATHS)


def linen_state(tx, model=None, **fields):
  model = model or small.linen_mlp()
  variables = dict(model.module.init(jax.random.key(0), np.ones(model.args[0].shape, np.float32)))
  params = variables.pop('params')
  cls = train_state_class(tuple(sorted(variables)))
  return cls.create(apply_fn=model.module.apply, params=params, tx=tx, **variables, **fields)


def save(path, state):
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.fspath(path), state)


def nnx_checkpoint(path, key=0, count=0, tx=None):
  """An NNX training state of `nnx_mlp` with its dropout stream at `key`, `count`."""
  model = small.nnx_mlp()
  model.dropout.rngs.key.set_value(jax.random.key(key))
  model.dropout.rngs.count.set_value(model.dropout.rngs.count[...] + count)
  save(path, nnx.state({'model': model, 'optimizer': nnx.Optimizer(model, tx or small.make_tx(), wrt=nnx.Param)}))


@pytest.mark.parametrize('use_orbax', [True, False], ids=['orbax', 'flax-msgpack'])
def test_a_step_the_target_cannot_hold_is_refused_not_wrapped(tmp_path, use_orbax):
  state = linen_state(small.make_tx()).replace(step=2**32 + 5)  # saved as int64
  if use_orbax:
    save(tmp_path / 'src', state)
  else:
    previous = flax.config.flax_use_orbax_checkpointing
    flax.config.update('flax_use_orbax_checkpointing', False)
    try:
      flax_checkpoints.save_checkpoint(str(tmp_path / 'src'), state, step=1)
    finally:
      flax.config.update('flax_use_orbax_checkpointing', previous)
  with pytest.raises(ShapeError, match=r'step = 4294967301 \(stored as int64\) does not fit the target\'s int32'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx',
        models=models_for(optimizer=small.make_tx, **MLP),
    )
  save(tmp_path / 'small', state.replace(step=5))
  with pytest.raises(ShapeError, match='does not fit'):
    compare_checkpoints(
        tmp_path / 'small', tmp_path / 'src', models=models_for(optimizer=small.make_tx, **MLP),
    )
  assert sorted(os.listdir(tmp_path)) == ['small', 'src']


def test_a_counter_that_fits_converts_from_int64(tmp_path):
  save(tmp_path / 'src', linen_state(small.make_tx()).replace(step=2**31 - 1))
  summary = convert_checkpoint(
      tmp_path / 'src', tmp_path / 'dst', 'nnx', models=models_for(optimizer=small.make_tx, **MLP),
  )
  assert summary['step'] == 2**31 - 1


def test_an_optimizer_with_no_state_converts_both_ways(tmp_path):
  state = linen_state(small.make_sgd())
  save(tmp_path / 'linen', state)
  models = dict(MLP, optimizer=small.make_sgd)
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models_for(**models))
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models_for(**models))
  rows, _, _ = compare_checkpoints(
      tmp_path / 'linen', tmp_path / 'back', models=models_for(**models),
  )
  assert [r.linen_path for r in rows if 'params' in r.linen_path] and all(r.identical for r in rows)


def test_hyperparameters_in_the_optimizer_state_keep_their_values(tmp_path):
  state = linen_state(small.make_injected())
  hyperparams = dict(state.opt_state.hyperparams, learning_rate=np.float32(3e-4))
  state = state.replace(opt_state=state.opt_state._replace(hyperparams=hyperparams))
  save(tmp_path / 'linen', state)
  models = dict(MLP, optimizer=small.make_injected)
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models_for(**models))
  rows, _, _ = compare_checkpoints(
      tmp_path / 'linen', tmp_path / 'nnx', models=models_for(**models),
  )
  learning_rate = [r for r in rows if r.linen_path.endswith('hyperparams/learning_rate')]
  assert learning_rate and learning_rate[0].nnx_path == 'optimizer/opt_state/hyperparams/learning_rate'
  assert all(r.identical for r in rows)
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models_for(**models))
  with ocp.StandardCheckpointer() as checkpointer:
    back = checkpointer.restore(os.fspath(tmp_path / 'back'))
  assert np.float32(back['opt_state']['hyperparams']['learning_rate']) == np.float32(3e-4)


def test_compare_compares_nnx_rng_state_and_says_what_it_cannot(tmp_path):
  nnx_checkpoint(tmp_path / 'a', key=1)
  nnx_checkpoint(tmp_path / 'same', key=1)
  nnx_checkpoint(tmp_path / 'b', key=2, count=3)
  models = dict(MLP, optimizer=small.make_tx)
  rows, _, extra = compare_checkpoints(
      tmp_path / 'a', tmp_path / 'same', models=models_for(**models),
  )
  rng = [r for r in rows if r.linen_path == '-']
  assert [r.nnx_path for r in rng] == ['model/dropout/rngs/count', 'model/dropout/rngs/key']
  assert all(r.identical for r in rows) and extra['rng_not_compared'] == []
  rows, _, _ = compare_checkpoints(tmp_path / 'a', tmp_path / 'b', models=models_for(**models))
  assert sorted(r.nnx_path for r in rows if not r.identical) == [
      'model/dropout/rngs/count', 'model/dropout/rngs/key'
  ]
  save(tmp_path / 'linen', linen_state(small.make_tx()))
  convert_checkpoint(
      tmp_path / 'linen', tmp_path / 'converted', 'nnx', models=models_for(**models),
  )
  rows, _, extra = compare_checkpoints(
      tmp_path / 'linen', tmp_path / 'converted', models=models_for(**models),
  )
  assert all(r.identical for r in rows)
  assert extra['rng_not_compared'] == ['model/dropout/rngs/count', 'model/dropout/rngs/key']


@pytest.mark.parametrize('in_memory', [False, True], ids=['streaming', 'in-memory'])
def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch, in_memory):
  from converters.checkpoint.orbax_files import CheckpointWriter

  save(tmp_path / 'src', linen_state(small.make_tx()))

  def full_disk(self, *args, **kwargs):
    directory = getattr(self, 'path', args[0])
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, 'partial'), 'w') as f:
      f.write('half')
    raise OSError(errno.ENOSPC, 'No space left on device')

  if in_memory:
    monkeypatch.setattr(ocp.StandardCheckpointer, 'save', full_disk)
  else:  # after some chunks are written
    monkeypatch.setattr(CheckpointWriter, 'write', full_disk)
  with pytest.raises(CheckpointError, match='writing the checkpoint failed: OSError: .*No space left'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'new' / 'parents' / 'dst', 'nnx',
        models=models_for(optimizer=small.make_tx, **MLP),
        options=CheckpointOptions(in_memory=in_memory),
    )
  assert sorted(os.listdir(tmp_path)) == ['src']  # the parents it created went too


def test_factories_that_raise_are_named_in_one_error(tmp_path):
  save(tmp_path / 'src', linen_state(small.make_tx()))

  def broken():
    raise RuntimeError('a bug of theirs')

  for option, what in [('linen_model', 'the Linen model'), ('optimizer', 'the optimizer'),
                       ('nnx_model', 'the NNX model')]:
    models = dict(MLP, optimizer=small.make_tx) | {option: broken}
    with pytest.raises(CheckpointError, match=f'{what}.*calling its factory failed: RuntimeError: a bug of theirs'):
      convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=models_for(**models))
  with pytest.raises(CheckpointError, match=r'gradient_transformation\(\)'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx',
        models=models_for(**MLP, optimizer=optax.MultiSteps(optax.adam(1e-3), 2)),
    )
  assert sorted(os.listdir(tmp_path)) == ['src']


@pytest.mark.parametrize('names, logical, rules, message', [
    (('fsdp', 'tensor'), False, None, "params/Dense_0/kernel: names 'fsdp', which the mesh ('data', 'model') lacks"),
    (('embed', 'mlp'), True, (('embed', None),), "params/Dense_0/kernel: logical name 'mlp' has no rule"),
])
def test_annotations_the_mesh_cannot_resolve_name_the_parameter(names, logical, rules, message):
  linen = lambda: LinenModel(small.LinenAnnotated(names, logical), small.X)
  nnx_model = lambda: small.NNXAnnotated(names, nnx.Rngs(0))
  models = UserModels(linen, nnx_model, small.ANNOTATED_PATHS, rules, small.make_tx)
  mesh = models.make_mesh()
  with pytest.raises(CheckpointError) as e:
    models.side('linen', mesh)
  assert message in str(e.value) and '--mesh-axes' in str(e.value)
  with pytest.raises(CheckpointError) as e:  # NNX fails creating the Variable: named too
    models.side('nnx', mesh)
  assert message.replace('params/Dense_0', 'model/dense') in str(e.value)


def test_an_nnx_factory_that_fails_on_a_logical_name_with_no_rule_is_told_the_rule(tmp_path):
  # A port whose factory builds and runs the model (Flax's lm1b behind
  # nnx.bridge.ToNNX(...).lazy_init) fails inside it, before the tool can name
  # the parameter, with JAX's words (this message is the one that port got).
  save(tmp_path / 'src', linen_state(small.make_tx()))

  def nnx_port():
    raise ValueError("Resource axis: kv of P('data', 'kv') is not found in mesh: ('data', 'model').")

  models = dict(MLP, optimizer=small.make_tx, nnx_model=nnx_port)
  with pytest.raises(CheckpointError, match=(
      r"the NNX model.*calling its factory failed: ValueError: Resource axis: kv .*; "
      r"if it names an axis that is not the mesh's .*NAME is a logical name: give it a rule "
      r"\(--rules; \(NAME, None\) replicates it"
  )):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=models_for(**models))
  assert sorted(os.listdir(tmp_path)) == ['src']
  # Inferring the mapping (`linen-nnx map`, `--paths infer`) makes the NNX model too: told alike.
  with pytest.raises(CheckpointError, match=r'NAME is a logical name: give it a rule'):
    models_for(**dict(models, paths='infer')).inferred()


def test_a_value_error_of_the_optimizer_or_the_linen_factory_is_not_told_about_mesh_axes(tmp_path):
  save(tmp_path / 'src', linen_state(small.make_tx()))

  def make_tx():
    raise ValueError('learning_rate must be positive')

  def linen_model():
    raise ValueError('a bad width')

  for models in (dict(MLP, optimizer=make_tx), dict(MLP, optimizer=small.make_tx, linen_model=linen_model)):
    with pytest.raises(CheckpointError, match='calling its factory failed: ValueError') as e:
      convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=models_for(**models))
    assert 'give it a rule' not in str(e.value)


def test_a_collection_of_the_models_own_converts_with_collections(tmp_path):
  model = small.linen_counting()
  state = linen_state(small.make_tx(), model)
  state = state.replace(counters={'calls': np.int32(7)})
  save(tmp_path / 'linen', state)
  models = dict(linen_model=small.linen_counting, nnx_model=small.nnx_counting,
                paths=small.COUNTING_PATHS, optimizer=small.make_tx)
  with pytest.raises(Exception, match="pass collections=\\{'counters'"):
    convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models_for(**models))
  assert zoo_tests.linen_nnx(
      'convert', tmp_path / 'linen', tmp_path / 'nnx', '--to', 'nnx',
      '--linen-model', f'{small.__name__}:linen_counting', '--nnx-model', f'{small.__name__}:nnx_counting',
      '--paths', f'{small.__name__}:COUNTING_PATHS', '--optimizer', f'{small.__name__}:make_tx',
      '--collections', f'{small.__name__}:COLLECTIONS',
  ) == 0
  with zoo_tests.in_mesh(None):
    model, _ = zoo_tests.nnx_restore(tmp_path / 'nnx', small.nnx_counting, small.make_tx())
  assert int(model.calls[...]) == 7
  rows, _, _ = compare_checkpoints(
      tmp_path / 'linen', tmp_path / 'nnx',
      models=models_for(collections=small.COLLECTIONS, **models),
  )
  assert 'model/calls' in [r.nnx_path for r in rows] and all(r.identical for r in rows)


def test_tuple_keyed_batch_stats_convert_both_ways_and_restore(tmp_path):
  """Linen's `'Dense_0/kernel/u'` and NNX's `('kernel', 'u')` keys, named by rules."""
  model = small.linen_spectral()
  state = linen_state(small.make_tx(), model)
  _, updated = model.module.apply(
      {'params': state.params, 'batch_stats': state.batch_stats}, np.ones((2, 8), np.float32),
      train=True, mutable=['batch_stats'],
  )
  state = state.replace(batch_stats=updated['batch_stats'])
  save(tmp_path / 'linen', state)
  models = UserModels(small.linen_spectral, small.nnx_spectral, paths=small.SPECTRAL_PATHS,
                      optimizer=small.make_tx)
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models)
  with zoo_tests.in_mesh(None):
    port, _ = zoo_tests.nnx_restore(tmp_path / 'nnx', small.nnx_spectral, small.make_tx())
  u = state.batch_stats['SpectralNorm_0']['Dense_0/kernel/u']
  np.testing.assert_array_equal(port.dense.batch_stats[('kernel', 'u')][...], u)
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models)
  rows, _, _ = compare_checkpoints(tmp_path / 'linen', tmp_path / 'back', models=models)
  assert "SpectralNorm_0/'Dense_0/kernel/u'" in {r.linen_path.removeprefix('batch_stats/') for r in rows}
  assert all(r.identical for r in rows)


def test_a_train_state_class_of_the_users_own_converts_both_ways_and_restores_as_that_class(tmp_path):
  """`LinenModel(train_state=...)`: Flax's ImageNet example's `TrainState`, with
  `batch_stats` and a `dynamic_scale` beyond the collections, one step in."""
  model = small.linen_spectral()
  state = linen_state(small.make_tx(), model)
  state = zoo_tests.ImageNetTrainState.create(
      apply_fn=state.apply_fn, params=state.params, tx=state.tx, batch_stats=state.batch_stats, dynamic_scale=None,
  )
  state = jax.jit(lambda s: s.apply_gradients(grads=jax.tree.map(lambda p: p * 0.5, s.params)))(state)  # one step
  save(tmp_path / 'src', state)
  linen = lambda: LinenModel(model.module, *model.args, train_state=zoo_tests.ImageNetTrainState)
  models = UserModels(linen, small.nnx_spectral, paths=small.SPECTRAL_PATHS, optimizer=small.make_tx)
  convert_checkpoint(tmp_path / 'src', tmp_path / 'nnx', 'nnx', models=models)
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models)
  with zoo_tests.in_mesh(None):
    back = zoo_tests.restore_like(tmp_path / 'back', state)
  assert isinstance(back, zoo_tests.ImageNetTrainState) and back.dynamic_scale is None
  zoo_tests.assert_states_equal(state, back, 0.0)


def test_an_optimizer_that_fails_on_the_nnx_parameters_is_named_not_the_model(tmp_path):
  """A mask written for the Linen parameters, as Linen users write `optax.masked`."""
  mask = {'Dense_0': {'kernel': True, 'bias': False}, 'Dense_1': {'kernel': True, 'bias': False}}
  save(tmp_path / 'linen', linen_state(optax.masked(optax.adam(1e-3), mask)))
  models = UserModels(small.linen_mlp, small.nnx_mlp, paths=small.PATHS,
                      optimizer=lambda: optax.masked(optax.adam(1e-3), mask))
  with pytest.raises(CheckpointError, match=r'^the optimizer: its init on the parameters of the NNX model') as e:
    convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models)
  assert 'convert the parameters alone' in str(e.value) and 'creating it abstractly' not in str(e.value)
  masked = UserModels(small.linen_mlp, small.nnx_mlp, paths=small.PATHS, optimizer=lambda: optax.masked(
      optax.adam(1e-3), lambda params: jax.tree.map(lambda p: p.ndim > 1, params)))
  with pytest.raises(CheckpointError, match=r'^the optimizer: its state holds optax.MaskedNode parts'):
    convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=masked)
  assert not (tmp_path / 'nnx').exists()


@pytest.mark.parametrize('in_memory', [False, True], ids=['streamed', 'in-memory'])
def test_an_optimizer_of_the_same_arrays_in_another_tree_is_named(tmp_path, in_memory):
  """adamw's three optax states read as adam's two: the same arrays, another tree."""
  save(tmp_path / 'linen', linen_state(optax.adam(1e-3)))
  models = UserModels(small.linen_mlp, small.nnx_mlp, paths=small.PATHS,
                      optimizer=lambda: optax.adamw(1e-3))
  message = r'holds the arrays of the training state the models give, but in another tree: opt_state \(the models: list of 3, the checkpoint: list of 2\)'
  with pytest.raises(CheckpointError, match=message):
    convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models,
                       options=CheckpointOptions(in_memory=in_memory))
  with pytest.raises(CheckpointError, match=message):
    compare_checkpoints(tmp_path / 'linen', tmp_path / 'linen', models=models)


def test_a_port_with_a_plain_array_attribute_is_refused_alike_by_convert_and_compare(tmp_path):
  """Convert used to write a checkpoint that compare could not read back."""
  save(tmp_path / 'linen', linen_state(small.make_tx(), small.linen_tabled()))
  models = UserModels(small.linen_tabled, small.nnx_tabled, paths=small.TABLED_PATHS,
                      optimizer=small.make_tx)
  message = r"^the NNX model \(.*nnx_tabled\): (model/table: |probably )?a plain array attribute, not an nnx.Variable.*compute it in __call__.*PathRule.nnx_only"

  for run in (
      lambda: convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models),
      lambda: compare_checkpoints(tmp_path / 'linen', tmp_path / 'linen', models=models),
  ):
    with pytest.raises(CheckpointError, match=message):
      run()
  assert not (tmp_path / 'nnx').exists()
  # In memory, into the real port, the same refusal and fix.
  variables = small.linen_tabled().module.init(jax.random.key(0), np.ones((2, 8), np.float32))
  with pytest.raises(StructureError, match=r'target/model/table: a plain array attribute \(.*compute it in __call__'):
    converters.linen_to_nnx(variables, target=small.nnx_tabled(), paths=small.TABLED_PATHS)


@pytest.mark.parametrize('in_memory, paths', [
    (False, small.TABLE_VARIABLE_PATHS), (True, small.TABLE_VARIABLE_PATHS), (False, 'infer'),
], ids=['streamed', 'in-memory', 'inferred'])
def test_state_only_the_port_has_converts_both_ways_and_compares_with_a_one_sided_rule(tmp_path, in_memory, paths):
  """A table held in a bare `nnx.Variable` that Linen computes on the fly (as
  Flax maintainers' own ports hold positional encodings)."""
  options = CheckpointOptions(in_memory=in_memory)
  state = linen_state(small.make_tx(), small.linen_tabled())
  save(tmp_path / 'linen', state)
  refused = UserModels(small.linen_tabled, small.nnx_table_variable, paths=small.TABLED_PATHS,
                       optimizer=small.make_tx)
  with pytest.raises(StructureError, match=r'the source lacks \[model/table \(no rule names it\)\].*PathRule.nnx_only'):
    convert_checkpoint(tmp_path / 'linen', tmp_path / 'refused', 'nnx', models=refused, options=options)
  models = UserModels(small.linen_tabled, small.nnx_table_variable, paths=paths, optimizer=small.make_tx)
  assert models.mapping == small.TABLE_VARIABLE_PATHS
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models, options=options)
  with zoo_tests.in_mesh(None):
    port, _ = zoo_tests.nnx_restore(tmp_path / 'nnx', small.nnx_table_variable, small.make_tx())
  # The factory's table, made under jax.jit (nothing else of the model is).
  np.testing.assert_array_equal(port.table[...], jax.jit(lambda: small.nnx_table_variable().table[...])())
  np.testing.assert_array_equal(port.dense.kernel[...], state.params['Dense_0']['kernel'])
  np.testing.assert_array_equal(port.dense.bias[...], state.params['Dense_0']['bias'])
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models, options=options)
  rows, _, extra = compare_checkpoints(tmp_path / 'linen', tmp_path / 'back', models=models)
  assert rows and all(r.identical for r in rows)
  rows, _, extra = compare_checkpoints(tmp_path / 'linen', tmp_path / 'nnx', models=models)
  assert rows and all(r.identical for r in rows) and extra['nnx_only_not_compared'] == ['model/table']
  rows, _, extra = compare_checkpoints(tmp_path / 'nnx', tmp_path / 'nnx', models=models)
  assert [r.nnx_path for r in rows if r.linen_path == '-'] == ['model/table']
  assert all(r.identical for r in rows) and extra['nnx_only_not_compared'] == []


@pytest.mark.parametrize('in_memory', [False, True], ids=['streamed', 'in-memory'])
def test_within_nnx_state_only_the_port_has_keeps_the_sources_values(tmp_path, in_memory):
  """Through Linen, which has none: kept from the source as RNG state is, not
  made anew by the factory."""
  port = small.nnx_table_variable()
  port.table[...] = port.table[...] + 0.5  # not what the factory makes
  save(tmp_path / 'nnx', nnx.state({'model': port, 'optimizer': nnx.Optimizer(port, small.make_tx(), wrt=nnx.Param)}))
  models = UserModels(small.linen_tabled, small.nnx_table_variable, paths=small.TABLE_VARIABLE_PATHS,
                      optimizer=small.make_tx)
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'copy', 'nnx', models=models,
                     options=CheckpointOptions(in_memory=in_memory))
  with zoo_tests.in_mesh(None):
    copy, _ = zoo_tests.nnx_restore(tmp_path / 'copy', small.nnx_table_variable, small.make_tx())
  np.testing.assert_array_equal(copy.table[...], port.table[...])
  rows, _, _ = compare_checkpoints(tmp_path / 'nnx', tmp_path / 'copy', models=models)
  assert 'model/table' in {r.nnx_path for r in rows} and all(r.identical for r in rows)


def test_within_linen_state_only_linen_has_keeps_the_sources_values(tmp_path):
  state = linen_state(small.make_tx(), small.linen_buffered())
  state = state.replace(consts={'table': state.consts['table'] + 0.5})  # not what init makes
  save(tmp_path / 'linen', state)
  models = UserModels(small.linen_buffered, small.nnx_tabled_free, paths=small.BUFFERED_PATHS,
                      optimizer=small.make_tx)
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'copy', 'linen', models=models)
  rows, _, _ = compare_checkpoints(tmp_path / 'linen', tmp_path / 'copy', models=models)
  assert ('consts/table', '(Linen only)') in {(r.linen_path, r.nnx_path) for r in rows}
  assert all(r.identical for r in rows)
  # Through an NNX checkpoint, which has no table, the Linen model's init makes it.
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models)
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models)
  rows, _, _ = compare_checkpoints(tmp_path / 'linen', tmp_path / 'back', models=models)
  assert [r.linen_path for r in rows if not r.identical] == ['consts/table']


@pytest.mark.nightly  # CI: state only the port has, inferred, converted and restored ([inferred] above)
def test_flax_masked_convolution_converts_with_its_mask_inferred_as_the_ports_own(tmp_path):
  from converters.checkpoint.compare import compare_outputs

  model = small.linen_masked()
  variables = model.module.init(jax.random.key(0), np.ones((2, 5, 5, 2), np.float32))
  save(tmp_path / 'linen', train_state.TrainState.create(apply_fn=None, params=variables['params'], tx=small.make_tx()))
  models = UserModels(small.linen_masked, small.nnx_masked, paths='infer', optimizer=small.make_tx)
  assert models.mapping.rules[-1] == converters.PathRule.nnx_only('conv/mask')
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models)
  with zoo_tests.in_mesh(None):
    port, _ = zoo_tests.nnx_restore(tmp_path / 'nnx', small.nnx_masked, small.make_tx())
  np.testing.assert_array_equal(port.conv.mask, small.MASK)
  rows, _, _ = compare_outputs(tmp_path / 'linen', tmp_path / 'nnx', models=models)
  assert rows and all(r.identical for r in rows)


def test_compare_names_state_only_linen_has():
  from converters.checkpoint.compare import nnx_path_of

  paths = small.TABLED_PATHS + [converters.PathRule.linen_only('table')]
  assert nnx_path_of(('consts', 'table'), paths) == '(Linen only)'
  assert nnx_path_of(('params', 'Dense_0', 'kernel'), paths) == 'model/dense/kernel'


def test_empty_nodes_and_container_kinds_the_models_lack_do_not_refuse_a_checkpoint(tmp_path):
  """A `None` field (Flax ImageNet's `dynamic_scale`) and a dict saved for a tuple hold no arrays."""
  import typing

  class WithScale(train_state.TrainState):
    dynamic_scale: typing.Any = None

  model = small.linen_mlp()
  params = model.module.init(jax.random.key(0), np.ones((2, 8), np.float32))['params']
  save(tmp_path / 'scale', WithScale.create(apply_fn=None, params=params, tx=small.make_tx()))
  save(tmp_path / 'dict', flax.serialization.to_state_dict(linen_state(small.make_tx())))
  models = UserModels(small.linen_mlp, small.nnx_mlp, paths=small.PATHS, optimizer=small.make_tx)
  for name in ('scale', 'dict'):
    convert_checkpoint(tmp_path / name, tmp_path / f'{name}_nnx', 'nnx', models=models)
    with zoo_tests.in_mesh(None):
      port, _ = zoo_tests.nnx_restore(tmp_path / f'{name}_nnx', small.nnx_mlp, small.make_tx())
    np.testing.assert_array_equal(port.up.kernel[...], params['Dense_0']['kernel'])
    np.testing.assert_array_equal(port.down.bias[...], params['Dense_1']['bias'])


@pytest.mark.parametrize('rules, collections, message', [
    ('embed', None, 'give logical axis rules as'),
    ((('embed',),), None, 'give logical axis rules as'),
    (None, {'counters': int}, 'nnx.Variable subclass'),
])
def test_options_of_the_wrong_type_are_refused(rules, collections, message):
  with pytest.raises(CheckpointError, match=message):
    UserModels(small.linen_mlp, small.nnx_mlp, small.PATHS, rules, small.make_tx, collections=collections)


# Nightly; CI: the same inference (`UserModels`, factories of both layouts,
# merged) through `linen-nnx map`, compared with the same rules
# (test_user_models.py's test_map_prints_the_inferred_mapping_as_python_and_json).
@pytest.mark.nightly
def test_the_checkpoint_tools_inference_over_factories_of_both_layouts_is_the_hand_written_mapping():
  """The checkpoint tool's own inference (`UserModels.mapping` with `paths='infer'`,
  factories of both layouts: each layout inferred, then merged), which
  test_infer's twin reaches only through the API."""
  from model_zoo import paths as zoo_paths
  from tests.converters.checkpoint import test_models as pairs

  models = models_for(**pairs.models_of(pairs.PAIRS['transformer'], optimizer=small.make_tx) | {'paths': 'infer'})
  assert {(r.linen, r.nnx, r.linen_stacked, r.nnx_stacked) for r in models.mapping.rules} == {
      (row.linen, row.nnx, row.linen_stacked, row.nnx_stacked) for row in zoo_paths.TRANSFORMER['params']
  }


# Nightly; CI: the same inference through the checkpoint tool
# (test_user_models.py's test_map_prints_the_inferred_mapping_as_python_and_json),
# the zoo transformer relaid out by the checkpoint tool, loop to scan and back
# (test_weights.py's test_weights_change_layout_on_the_way), a conversion with
# paths inferred (test_user_models.py's test_convert_and_compare_with_paths_inferred).
@pytest.mark.nightly
def test_paths_infer_converts_and_relayouts_with_factories_of_both_layouts(tmp_path):
  from tests.converters.checkpoint import test_models as pairs

  pair = pairs.PAIRS['transformer']
  with pairs.in_mesh(pair['rules']):
    state = pairs.linen_train_state(pair, small.make_tx(), layout='loop')
  save(tmp_path / 'loop', state)
  inferred = pairs.models_of(pair, optimizer=small.make_tx) | {'paths': 'infer'}
  hand_written = pairs.models_of(pair, optimizer=small.make_tx)
  convert_checkpoint(
      tmp_path / 'loop', tmp_path / 'scan', 'nnx', models=models_for(**inferred), layout='scan',
  )
  # Read with the hand-written mapping, in the source's layout: every leaf as it was.
  rows, _, _ = compare_checkpoints(
      tmp_path / 'loop', tmp_path / 'scan', models=models_for(**hand_written),
  )
  assert rows and all(r.identical for r in rows)


# Nightly; CI: the mapping across layouts in test_infer (test_a_model_that_scans_maps_to_a_port_that_loops),
# training states converted through one (test_api's
# test_a_mapping_with_one_layout_per_side_converts_training_states_across_layouts), the transformer
# relaid out by the checkpoint tool (test_weights.py's test_weights_change_layout_on_the_way).
@pytest.mark.nightly
def test_paths_infer_maps_a_linen_model_that_scans_to_a_port_that_loops(tmp_path):
  """One factory per side, each of its own layout: the checkpoint converts
  to the port's layout and back, leaf for leaf."""
  from tests.converters.checkpoint import test_models as pairs

  pair = pairs.PAIRS['transformer']
  with pairs.in_mesh(pair['rules']):
    state = pairs.linen_train_state(pair, small.make_tx(), layout='scan')
  save(tmp_path / 'linen', state)
  one_layout_each = dict(
      linen_model=lambda: zoo.linen_transformer('scan'), nnx_model=lambda: zoo.nnx_transformer('loop'),
      rules=pair['rules'], optimizer=small.make_tx, paths='infer',
  )
  summary = convert_checkpoint(
      tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models_for(**one_layout_each),
  )
  assert summary['verified']
  hand_written = pairs.models_of(pair, optimizer=small.make_tx)
  rows, _, _ = compare_checkpoints(
      tmp_path / 'linen', tmp_path / 'nnx', models=models_for(**hand_written),
  )
  assert rows and all(r.identical for r in rows)
  with ocp.StandardCheckpointer() as checkpointer:  # stored looped, as the port has it
    stored = checkpointer.metadata(os.fspath(tmp_path / 'nnx')).item_metadata
  assert set(stored['model']['blocks']) == {'0', '1'}
  convert_checkpoint(
      tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models_for(**one_layout_each),
  )
  rows, _, _ = compare_checkpoints(
      tmp_path / 'linen', tmp_path / 'back', models=models_for(**hand_written),
  )
  assert rows and all(r.identical for r in rows)


def test_paths_infer_of_factories_of_one_layout_refuses_a_relayout(tmp_path):
  save(tmp_path / 'src', linen_state(small.make_tx()))
  models = dict(MLP, optimizer=small.make_tx, paths='infer')
  summary = convert_checkpoint(
      tmp_path / 'src', tmp_path / 'nnx', 'nnx', models=models_for(**models),
  )
  assert summary['verified']
  with pytest.raises(CheckpointError, match="layout 'scan' asked for, but the nnx model has no layers"):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'scan', 'nnx', models=models_for(**models), layout='scan',
    )
