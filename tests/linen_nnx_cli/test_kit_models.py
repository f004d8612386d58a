"""Tests of `linen_nnx_cli.kit_models`: the kit's MLP described by its own checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from converters.checkpoint import inspect as checkpoints
from linen_nnx_cli import kit_models as kit
from converters.errors import CheckpointError
from tests.converters.checkpoint.fixtures import DESC, write_checkpoint


@pytest.mark.parametrize('framework', ['linen', 'nnx'])
@pytest.mark.parametrize('scan', [False, True])
@pytest.mark.parametrize('optimizer', ['adam', 'sgd_momentum', 'fsdp_sgd'])
def test_describe_reads_layout_size_and_optimizer(tmp_path, framework, scan, optimizer):
  desc = DESC.replace(use_scan=scan)
  write_checkpoint(tmp_path / 'ckpt', framework, desc, optimizer, steps=1)
  info = checkpoints.inspect(tmp_path / 'ckpt')
  assert (info.format, info.framework) == ('orbax', framework)
  described = kit.describe(info)
  assert described.layout == ('scan' if scan else 'loop')
  assert (described.num_layers, described.depth, described.dtype, described.optimizer) == (
      2, 32, 'float32', optimizer
  )


def test_unknown_optimizer_state_is_named(tmp_path):
  from linen_impl import checkpoint as linen_checkpoint
  import optax

  from tests.converters.checkpoint.fixtures import trained_state

  trainer, state = trained_state('linen', DESC, 'adam', steps=1)
  state = state.replace(opt_state=(optax.ScaleByRmsState(nu=state.opt_state[0].nu),))
  linen_checkpoint.save(tmp_path / 'ckpt', state)
  info = checkpoints.inspect(tmp_path / 'ckpt')  # any training state is read
  with pytest.raises(CheckpointError, match=r"opt_state/0 holds \['nu'\].*--optimizer pkg.module:make_tx"):
    kit.describe(info)


def test_adamw_is_told_from_adam_in_linen_and_named_by_the_caller_in_nnx(tmp_path):
  write_checkpoint(tmp_path / 'linen', 'linen', DESC, 'adamw', steps=1)
  assert kit.describe(checkpoints.inspect(tmp_path / 'linen')).optimizer == 'adamw'
  write_checkpoint(tmp_path / 'nnx', 'nnx', DESC, 'adamw', steps=1)
  info = checkpoints.inspect(tmp_path / 'nnx')
  assert kit.describe(info).optimizer == 'adam'  # NNX keeps no empty optax states
  assert kit.describe(info, 'adamw').optimizer == 'adamw'
  with pytest.raises(CheckpointError, match="not the state of optimizer='sgd_momentum'"):
    kit.describe(info, 'sgd_momentum')
  # A Linen state tells them apart: naming the other is refused, not read as corrupted.
  write_checkpoint(tmp_path / 'adam', 'linen', DESC, 'adam', steps=1)
  with pytest.raises(CheckpointError, match=r"holds the state of adam \(two optax states\), not of optimizer='adamw'"):
    kit.describe(checkpoints.inspect(tmp_path / 'adam'), 'adamw')
  with pytest.raises(CheckpointError, match=r"holds the state of adamw \(three optax states\), not of optimizer='adam'"):
    kit.describe(checkpoints.inspect(tmp_path / 'linen'), 'adam')


@pytest.mark.parametrize('params, rank', [
    ({'DotReluDot_0': {'Dense_0': {'kernel': {'value': np.float32(1)}}}}, 2),
    ({'ScanDotReluDot_0': {'Dense_0': {'kernel': {'value': np.zeros((2, 4), np.float32)}}}}, 3),
])
def test_kernel_of_the_wrong_rank_is_reported(tmp_path, params, rank):
  from flax import serialization

  state = {'step': np.int32(0), 'params': params, 'opt_state': {'0': {'count': np.int32(0)}}}
  path = tmp_path / 'checkpoint_0'
  path.write_bytes(serialization.msgpack_serialize(state))
  info = checkpoints.inspect(path)
  with pytest.raises(CheckpointError, match=f'not rank {rank}.*--linen-model and --nnx-model'):
    kit.describe(info)
