"""Tests of `converters.checkpoint.convert`: all-or-nothing checkpoint conversion."""

from __future__ import annotations

import os

import jax
import pytest

from converters.checkpoint import inspect as checkpoints
from converters.checkpoint import training_states
from converters.checkpoint.convert import CheckpointOptions, convert_checkpoint
from linen_nnx_cli import kit_models as kit
from linen_nnx_cli.kit_models import KitModels, models_for
from converters.checkpoint.sides import CheckpointPlan
from converters.errors import CheckpointError
from converters.optimizer_state import NNX_OPTIMIZER
from converters.presets import KIT_PATHS
from linen_impl import checkpoint as linen_checkpoint
from nnx_impl import checkpoint as nnx_checkpoint
from tests.converters.checkpoint.fixtures import (
    DESC,
    assert_bit_identical,
    assert_same_values_by_layer,
    flat,
    trained_state,
    tree_checksum,
    write_checkpoint,
    write_unfinished_checkpoint,
)

MODULES = {'linen': linen_checkpoint, 'nnx': nnx_checkpoint}
CASES = [
    # (source framework, source scan, target framework, target layout, optimizer)
    ('linen', False, 'nnx', None, 'adam'),
    # Nightly: a scanned Linen source (test_round_trip_is_the_identity), NNX's
    # scanned one (the last case); the optimizers' moments in test_api.
    pytest.param('linen', True, 'nnx', 'loop', 'sgd_momentum', marks=pytest.mark.nightly),
    ('nnx', False, 'linen', 'scan', 'fsdp_sgd'),
    pytest.param('nnx', True, 'linen', None, 'adamw', marks=pytest.mark.nightly),
    ('linen', False, 'linen', 'scan', 'adam'),
    ('nnx', True, 'nnx', 'loop', 'adam'),
]


@pytest.mark.parametrize('source, scan, target, layout, optimizer', CASES)
def test_converted_checkpoint_restores_with_the_other_sides_ordinary_code(
    tmp_path, source, scan, target, layout, optimizer
):
  src, dst = tmp_path / 'src', tmp_path / 'dst'
  source_trainer, source_state = write_checkpoint(src, source, DESC.replace(use_scan=scan), optimizer)
  before = tree_checksum(src)
  # An NNX checkpoint cannot tell adamw from adam: the caller says it.
  summary = convert_checkpoint(
      src, dst, target, models=models_for(optimizer=optimizer), layout=layout,
  )
  assert tree_checksum(src) == before
  out_scan = scan if layout is None else layout == 'scan'
  assert summary['destination']['layout'] == ('scan' if out_scan else 'loop')
  assert summary['step'] == 2 and summary['verified']
  assert not [p for p in os.listdir(tmp_path) if '.partial-' in p]

  # The target's ordinary `restore` reads DST, and every parameter, moment and
  # counter in it holds the source's value, read off both trees by their own
  # paths (not by the converter's mapping).
  out_desc = DESC.replace(use_scan=out_scan)
  mesh = source_trainer.mesh
  target_trainer = kit.trainer_for(target, out_desc, mesh, optimizer)
  with jax.set_mesh(mesh):
    restored = MODULES[target].restore(dst, target_trainer)
  assert_same_values_by_layer(flat(source_state), flat(restored))


def test_round_trip_is_the_identity(tmp_path):
  trainer, state = trained_state('linen', DESC, 'adam')
  # A value training can leave that `==` cannot tell from 0.0: only bits can.
  w2 = state.params['DotReluDot_1']['W2']
  negative_zero = jax.device_put(w2.value.at[0, 0].set(-0.0), w2.value.sharding)
  layer = {**state.params['DotReluDot_1'], 'W2': w2.replace(value=negative_zero)}
  state = state.replace(params={**state.params, 'DotReluDot_1': layer})
  linen_checkpoint.save(tmp_path / 'linen', state)
  # There streamed, back in memory: both writers, across frameworks and
  # layouts, give the source's bits (test_streaming's nightly test compares
  # the two on the zoo's transformer).
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', layout='scan', models=KitModels())
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', layout='loop', models=KitModels(),
                     options=CheckpointOptions(in_memory=True))
  with jax.set_mesh(trainer.mesh):
    assert_bit_identical(state, linen_checkpoint.restore(tmp_path / 'back', trainer))


def test_existing_destination_needs_force(tmp_path):
  write_checkpoint(tmp_path / 'src')
  write_checkpoint(tmp_path / 'dst', 'linen', steps=1)
  with pytest.raises(CheckpointError, match='already exists; pass --force'):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=KitModels())
  assert checkpoints.inspect(tmp_path / 'dst').framework == 'linen'
  convert_checkpoint(
      tmp_path / 'src', tmp_path / 'dst', 'nnx', options=CheckpointOptions(force=True), models=KitModels(),
  )
  assert checkpoints.inspect(tmp_path / 'dst').framework == 'nnx'
  assert sorted(os.listdir(tmp_path)) == ['dst', 'src']  # no partial or replaced left


def test_force_never_replaces_a_directory_that_holds_no_checkpoint(tmp_path):
  write_checkpoint(tmp_path / 'src')
  (tmp_path / 'dst').mkdir()
  (tmp_path / 'dst' / 'keep.txt').write_text('mine')
  with pytest.raises(CheckpointError, match='holds something other than a checkpoint; --force only replaces'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx', options=CheckpointOptions(force=True), models=KitModels(),
    )
  assert os.listdir(tmp_path / 'dst') == ['keep.txt']
  assert (tmp_path / 'dst' / 'keep.txt').read_text() == 'mine'


def test_a_failed_rename_into_place_puts_the_replaced_dst_back(tmp_path, monkeypatch):
  from converters.checkpoint import convert as checkpoint_convert

  write_checkpoint(tmp_path / 'src')
  write_checkpoint(tmp_path / 'dst', 'linen', steps=1)
  before = tree_checksum(tmp_path / 'dst')
  rename = os.rename

  def failing_rename(a, b):
    if '.dst.partial-' in os.fspath(a) and os.fspath(b) == os.fspath(tmp_path / 'dst'):
      raise OSError(28, 'No space left on device')
    rename(a, b)

  monkeypatch.setattr(checkpoint_convert.os, 'rename', failing_rename)
  with pytest.raises(CheckpointError, match='could not be moved into place: No space left on device; DST is as it was'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx', options=CheckpointOptions(force=True), models=KitModels(),
    )
  assert tree_checksum(tmp_path / 'dst') == before
  assert sorted(os.listdir(tmp_path)) == ['dst', 'src']


@pytest.mark.parametrize('dst, relation', [
    ('src', 'is'), ('src/inner', 'lies inside'), ('.', 'contains'),
])
def test_destination_overlapping_the_source_is_refused_even_with_force(tmp_path, dst, relation):
  write_checkpoint(tmp_path / 'src')
  before = tree_checksum(tmp_path / 'src')
  with pytest.raises(CheckpointError, match=f'{relation} the source'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / dst, 'nnx', options=CheckpointOptions(force=True), models=KitModels(),
    )
  assert tree_checksum(tmp_path / 'src') == before


@pytest.mark.parametrize('source_scan, layout', [(False, 'scan'), (True, 'loop'), (True, None)])
def test_layer_partition_names_the_stacked_axis_of_the_scanned_side(tmp_path, source_scan, layout):
  source_desc = DESC.replace(use_scan=source_scan, layer_partition='data' if source_scan else None)
  source_trainer, state = write_checkpoint(tmp_path / 'src', 'linen', source_desc, 'adam')
  convert_checkpoint(
      tmp_path / 'src', tmp_path / 'dst', 'nnx', models=models_for(layer_partition='data'),
      layout=layout,
  )
  out_scan = source_scan if layout is None else layout == 'scan'
  out_desc = DESC.replace(use_scan=out_scan, layer_partition='data' if out_scan else None)
  trainer = kit.trainer_for('nnx', out_desc, source_trainer.mesh, 'adam')
  with jax.set_mesh(trainer.mesh):
    restored = nnx_checkpoint.restore(tmp_path / 'dst', trainer)
    plan = CheckpointPlan(
        trainer.mesh, kit.side_of('linen', source_trainer), kit.side_of('nnx', trainer), None,
        KIT_PATHS, None, NNX_OPTIMIZER,
    )
    expected = training_states.convert(state, plan)
    assert_bit_identical(expected, restored)
  kernel = restored['model']['layers']
  kernel = kernel['dot1']['kernel'] if out_scan else kernel[0]['dot1']['kernel']
  assert tuple(kernel[...].sharding.spec) == (('data', None, 'model') if out_scan else (None, 'model'))


def test_layer_partition_with_no_scanned_side_is_refused(tmp_path):
  write_checkpoint(tmp_path / 'src')
  with pytest.raises(CheckpointError, match="layer_partition='data' names the stacked layer axis, but no side is scanned"):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx', models=models_for(layer_partition='data'),
    )
  assert not os.path.exists(tmp_path / 'dst')


def test_unfinished_source_is_refused_unless_allowed(tmp_path):
  _, _, temporary = write_unfinished_checkpoint(tmp_path / 'src')
  with pytest.raises(CheckpointError, match='unfinished Orbax save'):
    convert_checkpoint(temporary, tmp_path / 'dst', 'nnx', models=KitModels())
  assert not os.path.exists(tmp_path / 'dst')
  summary = convert_checkpoint(
      temporary, tmp_path / 'dst', 'nnx', options=CheckpointOptions(allow_unfinished=True), models=KitModels(),
  )
  assert summary['verified'] and checkpoints.inspect(tmp_path / 'dst').framework == 'nnx'


def test_bad_source_writes_nothing(tmp_path):
  write_checkpoint(tmp_path / 'src')
  os.remove(tmp_path / 'src' / '_METADATA')
  with pytest.raises(CheckpointError, match='corrupted or incomplete'):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'out' / 'dst', 'nnx', models=KitModels())
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_stale_partial_output_of_a_killed_run_is_removed(tmp_path):
  write_checkpoint(tmp_path / 'src')
  stale = tmp_path / '.dst.partial-999999999'  # no such process
  (stale / 'checkpoint.orbax-checkpoint-tmp').mkdir(parents=True)
  convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=KitModels())
  assert sorted(os.listdir(tmp_path)) == ['dst', 'src']




def _lose_a_chunk(path) -> None:
  """What a disk that loses one array chunk of `path` leaves."""
  import tensorstore as ts

  store = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{path}/'}).result()
  lost = [k for k in store.list().result() if k.startswith(b'model.layers.1.w2.value/')][-1]
  store.delete_range(ts.KvStore.KeyRange(lost, lost + b'\0')).result()


def _losing_save(save):
  """The in-memory path's `save`, on a disk that loses one array chunk."""

  def losing(path, state):
    save(path, state)
    _lose_a_chunk(path)

  return losing


def _losing_metadata(write_metadata):
  """The streaming writer's last step, on a disk that lost one array chunk."""

  def losing(self, *args, **kwargs):
    write_metadata(self, *args, **kwargs)
    _lose_a_chunk(self.path)

  return losing


@pytest.mark.parametrize('in_memory', [False, True])
def test_data_lost_while_writing_fails_verification_and_moves_nothing(tmp_path, monkeypatch, capsys, in_memory):
  from linen_nnx_cli import main as cli
  from converters.checkpoint.orbax_files import CheckpointWriter
  from converters.errors import VerificationError

  write_checkpoint(tmp_path / 'src')
  if in_memory:
    monkeypatch.setattr(checkpoints, 'save', _losing_save(checkpoints.save))
  else:
    monkeypatch.setattr(CheckpointWriter, 'write_metadata', _losing_metadata(CheckpointWriter.write_metadata))
  with pytest.raises(VerificationError, match=r'cannot be read back at \[model/layers/1/w2/value\]'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx', options=CheckpointOptions(in_memory=in_memory), models=KitModels(),
    )
  assert sorted(os.listdir(tmp_path)) == ['src']
  argv = ['convert', str(tmp_path / 'src'), str(tmp_path / 'dst'), '--to', 'nnx']
  assert cli.main(argv + (['--in-memory'] if in_memory else [])) == 1
  assert 'model/layers/1/w2/value' in capsys.readouterr().err
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_models_without_the_members_of_a_model_pair_are_refused(tmp_path):
  write_checkpoint(tmp_path / 'src')

  class NotAPair:
    def plan(self, info, to=None, layout=None):
      raise AssertionError('never called')

  with pytest.raises(CheckpointError, match=r"lacks \['summary', 'agreement'\]"):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=NotAPair())
  with pytest.raises(CheckpointError, match='give an instance'):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=kit.KitModels)
  # The checkpoint tool knows no model of its own, the kit's MLP included.
  with pytest.raises(CheckpointError, match=r"models= is not given: .*linen_nnx_cli.kit_models.KitModels\(\)"):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx')
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_options_must_be_checkpoint_options(tmp_path):
  with pytest.raises(CheckpointError, match=r"options=\{'force': True\}: give CheckpointOptions"):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', options={'force': True}, models=KitModels())


class Wrapped:
  """The kit's MLP behind a model pair of one's own, which may plan otherwise."""

  def __init__(self, plan_to=None, plan_layout=None):
    self.inner, self.calls = kit.KitModels(), []
    self.plan_to, self.plan_layout = plan_to, plan_layout

  def plan(self, info, to=None, layout=None):
    self.calls.append('plan')
    return self.inner.plan(info, self.plan_to or to, self.plan_layout or layout)

  def summary(self, info):
    return {**self.inner.summary(info), 'path': '/elsewhere', 'framework': 'neither'}

  def agreement(self):
    return self.inner.agreement()


def test_a_model_pair_of_ones_own_is_read_through_its_members(tmp_path):
  """Anything with the members of `ModelPair` serves: here the kit's MLP, wrapped."""
  write_checkpoint(tmp_path / 'src')
  models = Wrapped()
  summary = convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=models)
  assert models.calls == ['plan'] and summary['verified']
  assert checkpoints.inspect(tmp_path / 'dst').framework == 'nnx'
  # What SRC is comes from SRC, whatever the models say of it.
  assert summary['source']['framework'] == 'linen'
  assert summary['source']['path'] == os.fspath(tmp_path / 'src')


@pytest.mark.parametrize('plan_to, plan_layout, message', [
    ('linen', None, 'writes linen, nnx was asked for'),
    (None, 'scan', 'writes the scan layout, loop was asked for'),
])
def test_a_model_pair_that_plans_something_else_is_refused(tmp_path, plan_to, plan_layout, message):
  write_checkpoint(tmp_path / 'src')
  with pytest.raises(CheckpointError, match=message):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx', layout='loop',
        models=Wrapped(plan_to=plan_to, plan_layout=plan_layout),
    )
  assert sorted(os.listdir(tmp_path)) == ['src']


@pytest.mark.parametrize('given, message', [
    (dict(rules=None), "needs its logical rules"),
    (dict(mesh_shape=(8,)), r"mesh_shape=\(8,\): the kit's MLP runs on a \('data', 'model'\) mesh"),
    (dict(optimizer=object()), 'an optax optimizer is for your models'),
    (dict(rules='fsdp'), 'give logical axis rules as'),
])
def test_the_kits_models_are_checked_when_made(given, message):
  with pytest.raises(CheckpointError, match=message):
    kit.KitModels(**given)
