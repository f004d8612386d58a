"""Tests of `converters.checkpoint.verify`: reading a written checkpoint back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from converters.checkpoint.inspect import string_path
from converters.checkpoint.verify import verify
from converters.errors import VerificationError
from linen_impl import checkpoint as linen_checkpoint
from tests.converters.checkpoint.fixtures import write_checkpoint

W2_MU = 'opt_state/0/mu/DotReluDot_1/W2/value'


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  """`{framework: (path, trainer, state)}`, written once; tests only read them."""
  out = {}
  for framework in ('linen', 'nnx'):
    path = tmp_path_factory.mktemp(framework) / 'ckpt'
    out[framework] = (str(path), *write_checkpoint(path, framework))
  return out


@pytest.mark.parametrize('chunk_bytes', [1, 4096, 2**30])  # a shard per read; some; all
@pytest.mark.parametrize('framework', ['linen', 'nnx'])
def test_what_was_saved_verifies(saved, framework, chunk_bytes):
  path, trainer, state = saved[framework]
  with jax.set_mesh(trainer.mesh):
    assert verify(path, state, chunk_bytes) == len(jax.tree.leaves(state))


@pytest.mark.parametrize('chunk_bytes', [1, 2**30])
def test_every_leaf_that_differs_is_named(saved, chunk_bytes):
  path, trainer, state = saved['linen']

  def changed(keypath, x):  # one bit of one element of an array also replicated
    is_w2_mu = '/'.join(string_path(keypath)) == W2_MU
    return x.at[0, 0].add(1e-7) if is_w2_mu else x

  with jax.set_mesh(trainer.mesh):
    wrong = jax.tree_util.tree_map_with_path(changed, state.replace(step=state.step + 1))
    with pytest.raises(VerificationError) as e:
      verify(path, wrong, chunk_bytes)
  assert set(e.value.paths) == {'step', W2_MU}
  assert 'nothing was moved into place' in str(e.value)


def test_bits_are_compared_not_values(tmp_path):
  trainer, state = write_checkpoint(tmp_path / 'ckpt', 'linen')
  w2 = state.opt_state[0].mu['DotReluDot_1']['W2']
  zeros = jnp.zeros_like(w2.value)
  with jax.set_mesh(trainer.mesh):
    state.opt_state[0].mu['DotReluDot_1']['W2'] = w2.replace_boxed(zeros)
    linen_checkpoint.save(tmp_path / 'positive', state)
    state.opt_state[0].mu['DotReluDot_1']['W2'] = w2.replace_boxed(-zeros)  # == 0.0, other bits
    with pytest.raises(VerificationError) as e:
      verify(str(tmp_path / 'positive'), state)
  assert e.value.paths == (W2_MU,)


def test_missing_extra_and_reshaped_leaves_are_named(saved):
  path, trainer, state = saved['linen']
  params = dict(state.params)
  del params['DotReluDot_0']
  params['Extra'] = params['DotReluDot_1']
  w2 = params['DotReluDot_1']['W2']
  params['DotReluDot_1'] = {**params['DotReluDot_1'], 'W2': w2.replace_boxed(w2.value[:, :16])}
  with jax.set_mesh(trainer.mesh), pytest.raises(VerificationError) as e:
    verify(path, state.replace(params=params))
  assert set(e.value.paths) == {
      'params/Extra/Dense_0/kernel/value', 'params/Extra/W2/value',
      'params/DotReluDot_1/W2/value',
      'params/DotReluDot_0/Dense_0/kernel/value', 'params/DotReluDot_0/W2/value',
  }


@pytest.mark.parametrize('chunk_bytes', [1, 2**30])
def test_missing_array_data_is_an_error_naming_the_leaf(tmp_path, chunk_bytes):
  import tensorstore as ts

  trainer, state = write_checkpoint(tmp_path / 'ckpt', 'linen')
  store = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{tmp_path / "ckpt"}/'}).result()
  chunks = [k for k in store.list().result() if k.startswith(b'params.DotReluDot_1.W2.value/')]
  assert chunks and b'params.DotReluDot_1.W2.value/.zarray' in chunks
  store.delete_range(ts.KvStore.KeyRange(chunks[-1], chunks[-1] + b'\0')).result()
  with jax.set_mesh(trainer.mesh), pytest.raises(VerificationError, match='cannot be read back') as e:
    verify(str(tmp_path / 'ckpt'), state, chunk_bytes)
  assert e.value.paths == ('params/DotReluDot_1/W2/value',)


def test_unreadable_metadata_is_an_error(tmp_path):
  trainer, state = write_checkpoint(tmp_path / 'ckpt', 'linen')
  (tmp_path / 'ckpt' / '_METADATA').unlink()
  with jax.set_mesh(trainer.mesh), pytest.raises(VerificationError, match='metadata'):
    verify(str(tmp_path / 'ckpt'), state)


def test_verifies_inside_a_running_event_loop(saved):
  import asyncio

  path, trainer, state = saved['linen']

  async def in_a_notebook():
    with jax.set_mesh(trainer.mesh):
      return verify(path, state)

  assert asyncio.run(in_a_notebook()) == 14
