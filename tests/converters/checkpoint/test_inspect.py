"""Tests of `converters.checkpoint.inspect`: what a checkpoint holds, and reading it.

The checkpoints are the kit MLP's (`tests.converters.checkpoint.fixtures`);
nothing here depends on the model but the checkpoints themselves.
"""

from __future__ import annotations

import os
import shutil

import flax
import jax
import numpy as np
import pytest
from flax.training import checkpoints as flax_checkpoints

from converters.checkpoint import inspect as checkpoints
from linen_nnx_cli import kit_models as kit
from converters.errors import CheckpointError
from tests.converters.checkpoint.fixtures import (
    DESC,
    assert_bit_identical,
    write_checkpoint,
    write_unfinished_checkpoint,
)


def target(framework, trainer):
  """What the kit trainer's own restore fills: its abstract state with shardings."""
  return kit.side_of(framework, trainer).abstract_state


def test_restore_reads_into_the_trainers_shardings(tmp_path):
  trainer, state = write_checkpoint(tmp_path / 'ckpt', 'linen')
  info = checkpoints.inspect(tmp_path / 'ckpt')
  checkpoints.check_structure(info, checkpoints.leaves_of(target('linen', trainer)), 'the MLP')
  with jax.set_mesh(trainer.mesh):
    restored = checkpoints.restore(info, target('linen', trainer))
  assert_bit_identical(state, restored)


@pytest.mark.parametrize('use_orbax', [True, False], ids=['flax-orbax', 'flax-msgpack'])
def test_flax_training_checkpoints_are_read_into_shardings(tmp_path, use_orbax):
  from tests.converters.checkpoint.fixtures import trained_state

  trainer, state = trained_state('linen', DESC, 'adam')
  previous = flax.config.flax_use_orbax_checkpointing
  flax.config.update('flax_use_orbax_checkpointing', use_orbax)
  try:
    flax_checkpoints.save_checkpoint(str(tmp_path), state, step=7)
  finally:
    flax.config.update('flax_use_orbax_checkpointing', previous)
  info = checkpoints.inspect(tmp_path)  # the directory: its newest checkpoint_<step>
  assert info.path == str(tmp_path / 'checkpoint_7')
  assert info.format == ('orbax' if use_orbax else 'flax-msgpack')
  with jax.set_mesh(trainer.mesh):
    restored = checkpoints.restore(info, target('linen', trainer))
  assert_bit_identical(state, restored)


def test_missing_path_and_non_checkpoint_directory(tmp_path):
  with pytest.raises(CheckpointError, match='no such file'):
    checkpoints.inspect(tmp_path / 'absent')
  (tmp_path / 'notes.txt').write_text('hello')
  with pytest.raises(CheckpointError, match=r'not a checkpoint.*notes\.txt'):
    checkpoints.inspect(tmp_path)


def test_src_is_resolved_as_the_os_resolves_it(tmp_path, monkeypatch):
  """`link/..` is the parent of where `link` points, not the folder holding `link`."""
  (tmp_path / 'real' / 'sub').mkdir(parents=True)
  write_checkpoint(tmp_path / 'real' / 'ckpt', 'nnx')
  write_checkpoint(tmp_path / 'ckpt', 'linen')
  os.symlink(tmp_path / 'real' / 'sub', tmp_path / 'link')
  monkeypatch.chdir(tmp_path)
  assert checkpoints.inspect('link/../ckpt').framework == 'nnx'
  assert checkpoints.inspect('ckpt').framework == 'linen'


def test_src_that_is_neither_file_nor_directory_is_reported(tmp_path):
  os.mkfifo(tmp_path / 'fifo')
  with pytest.raises(CheckpointError, match='neither a checkpoint directory nor a checkpoint file'):
    checkpoints.inspect(tmp_path / 'fifo')


def test_missing_metadata_file_is_reported(tmp_path):
  write_checkpoint(tmp_path / 'ckpt')
  os.remove(tmp_path / 'ckpt' / '_METADATA')
  with pytest.raises(CheckpointError, match='corrupted or incomplete; reading its Orbax metadata'):
    checkpoints.inspect(tmp_path / 'ckpt')


@pytest.mark.parametrize('cut', ['largest', 'every'])
def test_truncated_array_data_is_reported_not_read_as_zeros(tmp_path, cut):
  trainer, _ = write_checkpoint(tmp_path / 'ckpt')
  data_dir = tmp_path / 'ckpt' / 'd'  # the OCDBT data files Orbax reads
  files = sorted(data_dir.iterdir(), key=lambda p: p.stat().st_size)
  for path in files[-1:] if cut == 'largest' else files:
    with open(path, 'r+b') as f:
      f.truncate(path.stat().st_size // 2)
  with pytest.raises(CheckpointError, match='corrupted or incomplete'):
    info = checkpoints.inspect(tmp_path / 'ckpt')
    with jax.set_mesh(trainer.mesh):
      checkpoints.restore(info, target('linen', trainer))


def test_unfinished_orbax_save_is_refused_unless_allowed(tmp_path):
  trainer, state, temporary = write_unfinished_checkpoint(tmp_path / 'ckpt')
  copied = tmp_path / 'copied'  # renamed or copied away: only the metadata tells
  shutil.copytree(temporary, copied)
  for path, why in [(temporary, 'does not consider it finalized'), (copied, 'no commit')]:
    with pytest.raises(CheckpointError, match=f'unfinished Orbax save .*{why}.*--allow-unfinished'):
      checkpoints.inspect(path)
    info = checkpoints.inspect(path, allow_unfinished=True)
    assert info.unfinished
    with jax.set_mesh(trainer.mesh):
      assert_bit_identical(state, checkpoints.restore(info, target('linen', trainer)))


def test_finished_save_is_not_unfinished(tmp_path):
  write_checkpoint(tmp_path / 'ckpt')
  assert not checkpoints.inspect(tmp_path / 'ckpt').unfinished


def test_truncated_msgpack_file_is_reported(tmp_path):
  from tests.converters.checkpoint.fixtures import trained_state

  _, state = trained_state('linen', DESC, 'adam', steps=1)
  previous = flax.config.flax_use_orbax_checkpointing
  flax.config.update('flax_use_orbax_checkpointing', False)
  try:
    path = flax_checkpoints.save_checkpoint(str(tmp_path), state, step=1)
  finally:
    flax.config.update('flax_use_orbax_checkpointing', previous)
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 100)
  with pytest.raises(CheckpointError, match='not a readable flax.training.checkpoints msgpack'):
    checkpoints.inspect(path)


def test_wrong_structure_lists_every_difference(tmp_path):
  trainer, _ = write_checkpoint(tmp_path / 'ckpt', 'linen')
  info = checkpoints.inspect(tmp_path / 'ckpt')
  other = kit.trainer_for('linen', DESC.replace(depth=64), trainer.mesh, 'adam')
  with pytest.raises(CheckpointError, match='does not hold the linen training state of the wider MLP') as e:
    checkpoints.check_structure(info, checkpoints.leaves_of(target('linen', other)), 'the wider MLP')
  assert 'params/DotReluDot_0/W2/value (32, 32) float32 (expected (64, 64) float32)' in str(e.value)
  assert len(e.value.paths) == 12  # 4 params, 4 mu, 4 nu
