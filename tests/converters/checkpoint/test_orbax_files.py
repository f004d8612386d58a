"""Tests for converters.checkpoint.orbax_files: Orbax's files, read and written chunk by chunk."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from jax.sharding import NamedSharding, PartitionSpec as P

from converters.checkpoint import inspect as checkpoints
from converters.checkpoint.orbax_files import (
    CheckpointWriter,
    SourceCheckpoint,
    chunk_grid,
    run_coroutine,
)
from converters.errors import CheckpointError


def _state():
  """Sharded and replicated arrays, a PRNG key, an integer step, an empty optax state."""
  mesh = jax.make_mesh((2, 4), ('data', 'model'))
  w = jax.device_put(
      jnp.arange(4 * 16 * 8, dtype=jnp.float32).reshape(4, 16, 8),
      NamedSharding(mesh, P(None, 'data', 'model')),
  )
  b = jax.device_put(jnp.linspace(-1, 1, 8, dtype=jnp.bfloat16), NamedSharding(mesh, P()))
  return {
      'params': {'w': w, 'b': b}, 'key': jax.random.key(7), 'step': jnp.int32(3),
      'opt_state': (optax.EmptyState(),),
  }


def _rewrite(src: str, dst: str, tree) -> None:
  """`src` written again by `CheckpointWriter`, every chunk moved as its bytes."""
  info = checkpoints.inspect(src)
  source = SourceCheckpoint(info)
  run_coroutine(source.open())
  writer = CheckpointWriter(dst)

  async def move():
    await writer.open()
    for array in source.arrays.values():
      await writer.create(array)
    for leaf, array in source.arrays.items():
      for index in np.ndindex(*chunk_grid(array.shape, array.chunks)):
        await writer.write_chunks([(array, index, (await source.read_chunks([(leaf, index)]))[0])])

  run_coroutine(move())
  writer.merge()
  writer.write_metadata(tree, source.arrays, source.extension_metadata())


def test_written_files_are_the_files_orbax_writes(tmp_path):
  state = _state()
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'orbax', state)
  _rewrite(str(tmp_path / 'orbax'), str(tmp_path / 'ours'), state)
  for name in ('_METADATA', '_sharding', 'array_metadatas/process_0'):
    ours = json.loads((tmp_path / 'ours' / name).read_text())
    theirs = json.loads((tmp_path / 'orbax' / name).read_text())
    assert ours == theirs, name
  step_metadata = [
      {k: v for k, v in json.loads((tmp_path / d / '_CHECKPOINT_METADATA').read_text()).items()
       if not k.endswith('timestamp_nsecs')}
      for d in ('ours', 'orbax')
  ]
  assert step_metadata[0] == step_metadata[1]
  # The ordinary restore, without a target: shardings, dtypes and values as saved.
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / 'ours')
  assert restored['params']['w'].sharding == state['params']['w'].sharding
  assert restored['params']['b'].dtype == jnp.bfloat16
  assert jax.random.key_impl(restored['key']) == jax.random.key_impl(state['key'])
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    if jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_regions_are_written_encoded_with_orbaxs_codec(tmp_path):
  writer = CheckpointWriter(str(tmp_path / 'ours'))
  metadata = CheckpointWriter.zarr_metadata((6, 4), np.dtype('float32'), (1, 4))
  assert metadata['compressor'] == {'id': 'zstd', 'level': 1} and metadata['chunks'] == [1, 4]
  from converters.checkpoint.orbax_files import StoredArray

  array = StoredArray('x', (6, 4), np.dtype('float32'), (1, 4), metadata)
  values = np.arange(24, dtype=np.float32).reshape(6, 4)

  async def write():
    await writer.open()
    await writer.create(array)
    await (await writer.write(array, ((0, 6), (0, 4)), values))

  run_coroutine(write())
  writer.merge()
  writer.write_metadata({'x': jax.ShapeDtypeStruct((6, 4), jnp.float32)}, {('x',): array}, {})
  with ocp.StandardCheckpointer() as checkpointer:
    np.testing.assert_array_equal(checkpointer.restore(tmp_path / 'ours')['x'], values)
  store = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{tmp_path / "ours"}/'}).result()
  assert sorted(k for k in store.list().result() if not k.endswith(b'.zarray')) == [
      f'x/{i}.0'.encode() for i in range(6)  # one chunk per row, as asked
  ]


def test_a_chunk_write_takes_its_bytes_as_it_starts(tmp_path):
  # The streaming conversion lets its copy of a chunk go before the write is
  # done (only TensorStore's waits for the disk): the bytes must be taken at once.
  from converters.checkpoint.orbax_files import StoredArray

  metadata = CheckpointWriter.zarr_metadata((4,), np.dtype('uint8'), (4,))
  array = StoredArray('x', (4,), np.dtype('uint8'), (4,), metadata)
  writer = CheckpointWriter(str(tmp_path / 'ours'))
  data = bytearray(b'abcd')

  async def write():
    await writer.open()
    await writer.create(array)
    written = writer.write_chunks([(array, (0,), data)])
    data[:] = b'wxyz'
    await written
    await writer.close()

  run_coroutine(write())
  writer.merge()
  store = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{tmp_path / "ours"}/'}).result()
  assert store.read(b'x/0').result().value == b'abcd'


def test_the_writer_keeps_no_btree_node_cache(tmp_path):
  # Orbax's context caches B-tree nodes (100 MB); a database written key by key
  # would fill it as it grows, and the writer's memory would grow with the size.
  def limit(context):
    return context['cache_pool#ocdbt'].to_json().get('total_bytes_limit', 0)

  assert limit(ocp.type_handlers.get_ts_context(use_ocdbt=True)) > 0
  assert limit(CheckpointWriter(str(tmp_path / 'ours'))._context) == 0


def test_a_missing_chunk_is_named_with_its_array(tmp_path):
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'src', _state())
  store = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{tmp_path / "src"}/'}).result()
  store.delete_range(ts.KvStore.KeyRange(b'params.w/0.1.0', b'params.w/0.1.0\0')).result()
  source = SourceCheckpoint(checkpoints.inspect(tmp_path / 'src'))
  run_coroutine(source.open())
  with pytest.raises(CheckpointError, match=r'chunk params.w/0.1.0 of params/w is missing') as e:
    run_coroutine(source.read_chunks([(('params', 'w'), (0, 1, 0))]))
  assert list(e.value.paths) == ['params/w']
  assert os.path.exists(tmp_path / 'src' / '_METADATA')
