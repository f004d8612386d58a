"""Tests of `converters.checkpoint.compare`: the path correspondence of its
rows, and the outputs of the models two checkpoints restore into."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from flax.training import train_state

from converters import convert_checkpoint
from converters.checkpoint.compare import compare_outputs, nnx_path_of
from converters.checkpoint.models import UserModels
from converters.errors import CheckpointError
from tests.converters.checkpoint import small_models as small
from linen_nnx_cli.kit_models import correspondence_of_name
from converters.presets import KIT_PATHS


@pytest.mark.parametrize('linen_path, optimizer, nnx_path', [
    (('step',), 'adam', 'optimizer/step'),
    (('params', 'DotReluDot_1', 'W2', 'value'), 'adam', 'model/layers/1/w2'),
    (('params', 'ScanDotReluDot_0', 'Dense_0', 'kernel'), 'adam', 'model/layers/dot1/kernel'),
    (('opt_state', '0', 'mu', 'DotReluDot_0', 'Dense_0', 'kernel', 'value'), 'adamw',
     'optimizer/opt_state/0/mu/layers/0/dot1/kernel'),
    (('opt_state', '0', 'count'), 'adam', 'optimizer/opt_state/0/count'),
    (('opt_state', '0', 'trace', 'ScanDotReluDot_0', 'W2'), 'sgd_momentum',
     'optimizer/opt_state/0/trace/layers/w2'),
    (('opt_state', '0', 'ema', 'DotReluDot_0', 'W2', 'value'), 'fsdp_sgd',
     'optimizer/momentum/layers/0/w2'),
    (('opt_state', '0', 'count'), 'fsdp_sgd', '(optimizer/step)'),
    (('params', 'Embed_0', 'embedding'), 'adam', '?'),
])
def test_nnx_path_of_follows_the_converters_correspondence(linen_path, optimizer, nnx_path):
  assert nnx_path_of(linen_path, KIT_PATHS, correspondence_of_name(optimizer)) == nnx_path


# -- compare_outputs: where a wrong conversion shows, not only at the example --


def _linen_checkpoint(path, linen_model) -> None:
  concrete = lambda x: jnp.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x
  args, kwargs = jax.tree.map(concrete, (linen_model.args, linen_model.kwargs))
  variables = linen_model.module.init(jax.random.key(0), *args, **kwargs)
  state = train_state.TrainState.create(apply_fn=None, params=variables['params'], tx=small.make_tx())
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.fspath(path), state)


def _compared(tmp_path, linen, port, paths, right_paths=None):
  """`compare_outputs` of a Linen checkpoint and its conversion through `paths`."""
  _linen_checkpoint(tmp_path / 'linen', linen())
  models = UserModels(linen, port, paths=paths, optimizer=small.make_tx)
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models)
  return compare_outputs(tmp_path / 'linen', tmp_path / 'nnx', models=models)[0]


def test_query_and_key_swapped_differ_on_tokens_other_than_the_constant_example(tmp_path):
  # The example holds constant tokens (arrays, on the 8-device mesh the models run on).
  rows = _compared(tmp_path / 'swapped', small.linen_token_attention, small.nnx_token_attention,
                   small.SWAPPED_ATTENTION_PATHS)
  differ = [r.linen_path for r in rows if not r.identical]
  assert all(r.identical for r in rows if 'the example inputs' in r.linen_path)  # the trap
  assert any('made generic' in name for name in differ), differ
  rows = _compared(tmp_path / 'right', small.linen_token_attention, small.nnx_token_attention,
                   small.ATTENTION_PATHS)
  assert rows and all(r.identical for r in rows)


@pytest.mark.parametrize('linen', [small.linen_keyword_attention, small.linen_abstract_keyword_attention])
def test_keyword_inputs_are_inputs_of_both_models_made_generic_like_positional_ones(tmp_path, linen):
  rows = _compared(tmp_path / 'swapped', linen, small.nnx_keyword_attention, small.SWAPPED_ATTENTION_PATHS)
  assert any('made generic' in r.linen_path for r in rows if not r.identical)
  rows = _compared(tmp_path / 'inferred', linen, small.nnx_keyword_attention, 'infer')
  assert rows and all(r.identical for r in rows)


def test_dropout_moved_to_the_other_kernel_differs_in_training(tmp_path):
  rows = _compared(tmp_path / 'swapped', small.linen_dropout_branch, small.nnx_dropout_branch,
                   small.SWAPPED_BRANCH_PATHS)
  differ = {r.linen_path for r in rows if not r.identical}
  assert differ and all('training' in name or 'gradient' in name for name in differ), differ
  assert any('training' in name for name in differ)
  rows = _compared(tmp_path / 'right', small.linen_dropout_branch, small.nnx_dropout_branch,
                   small.BRANCH_PATHS)
  assert rows and all(r.identical for r in rows)


def test_a_model_that_fails_to_run_is_a_checkpoint_error_naming_the_checkpoint(tmp_path):
  _linen_checkpoint(tmp_path / 'linen', small.linen_mlp())
  models = UserModels(small.linen_mlp, small.nnx_mlp, paths=small.PATHS, optimizer=small.make_tx)
  convert_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', 'nnx', models=models)
  failing = UserModels(small.linen_mlp, small.nnx_failing, paths=small.PATHS, optimizer=small.make_tx)
  with pytest.raises(CheckpointError, match='running the NNX model restored from it failed') as info:
    compare_outputs(tmp_path / 'linen', tmp_path / 'nnx', models=failing)
  assert str(tmp_path / 'nnx') in str(info.value) and '\n' not in str(info.value)


def test_a_call_time_dropout_flag_and_a_port_under_nnx_remat_compare_in_every_run(tmp_path):
  rows = _compared(tmp_path, small.linen_call_flag, small.nnx_remat_mlp, small.PATHS)
  names = [r.linen_path for r in rows]
  assert any('training' in n for n in names) and any('gradient' in n for n in names), names
  assert all(r.identical for r in rows), [(r.linen_path, r.max_abs_diff) for r in rows]


def test_integer_outputs_compare_without_a_run_backward(tmp_path):
  rows = _compared(tmp_path, small.linen_argmax, small.nnx_argmax, small.PATHS)
  assert rows and all(r.identical for r in rows)
  assert not any('gradient' in r.linen_path for r in rows)
