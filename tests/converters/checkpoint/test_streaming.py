"""Tests for converters.checkpoint.streaming: disk-to-disk conversion within a memory budget."""

from __future__ import annotations

import asyncio
import os
import pathlib
import weakref

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

from converters import relayout_ops
from converters.checkpoint import inspect as checkpoints
from converters.checkpoint import streaming
from converters.checkpoint.convert import CheckpointOptions, convert_checkpoint
from linen_nnx_cli.kit_models import KitModels, models_for
from converters.checkpoint.orbax_files import CheckpointWriter, SourceCheckpoint
from converters.errors import CheckpointError
from tests.converters.checkpoint import zoo_models as zoo
from tests.converters.checkpoint.fixtures import DESC, write_checkpoint


def _chunks(path) -> dict[bytes, bytes]:
  """Every array chunk of an Orbax checkpoint, by key, as stored (encoded)."""
  store = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{path}/'}).result()
  return {
      k: store.read(k).result().value for k in store.list().result() if not k.endswith(b'.zarray')
  }


def _restored(path) -> dict[tuple, np.ndarray]:
  """Every leaf of a checkpoint, as the ordinary restore (no target) reads it."""
  with ocp.StandardCheckpointer() as checkpointer:
    tree = checkpointer.restore(path)
  out = {}
  for keypath, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
      value = jax.random.key_data(value)
    out[checkpoints.string_path(keypath)] = np.asarray(value)
  return out


def assert_same_checkpoint(a, b) -> None:
  left, right = _restored(a), _restored(b)
  assert left.keys() == right.keys()
  for leaf in left:
    assert left[leaf].dtype == right[leaf].dtype and left[leaf].shape == right[leaf].shape, leaf
    assert left[leaf].tobytes() == right[leaf].tobytes(), leaf


def test_unchanged_chunks_move_as_their_bytes_and_stacks_keep_a_layer_per_chunk(tmp_path):
  write_checkpoint(tmp_path / 'src')
  source = _chunks(tmp_path / 'src')
  convert_checkpoint(tmp_path / 'src', tmp_path / 'loop', 'nnx', models=KitModels())
  convert_checkpoint(tmp_path / 'src', tmp_path / 'scan', 'nnx', layout='scan', models=KitModels())
  same, stacked = _chunks(tmp_path / 'loop'), _chunks(tmp_path / 'scan')
  # Same layout: each parameter chunk is the source's chunk, byte for byte.
  assert same[b'model.layers.1.w2.value/3.0'] == source[b'params.DotReluDot_1.W2.value/3.0']
  moved = [k for k in same if b'layers' in k]
  assert len(moved) == len([k for k in source if b'DotReluDot' in k])
  assert all(same[k] in source.values() for k in moved)
  # Stacked: one chunk per layer, each the layer's own chunk as stored.
  for layer in range(DESC.num_layers):
    assert stacked[f'model.layers.w2.value/{layer}.3.0'.encode()] == source[
        f'params.DotReluDot_{layer}.W2.value/3.0'.encode()
    ]
  # Unstacking what it stacked moves bytes again: the round trip is the source's chunks.
  convert_checkpoint(tmp_path / 'scan', tmp_path / 'back', 'linen', layout='loop', models=KitModels())
  back = _chunks(tmp_path / 'back')
  assert {k: v for k, v in back.items() if b'DotReluDot' in k} == {
      k: v for k, v in source.items() if b'DotReluDot' in k
  }
  assert_same_checkpoint(tmp_path / 'back', tmp_path / 'src')


def _zoo_state(tmp_path, layout: str):
  """A Linen transformer training state of the zoo, scanned or looped, saved by Orbax."""
  from converters.checkpoint.models import UserModels

  user = UserModels(
      lambda: zoo.linen_transformer(layout), lambda: zoo.nnx_transformer(layout),
      zoo.TRANSFORMER_PATHS, zoo.TRANSFORMER_RULES, zoo.make_tx, (2, 4),
  )
  abstract = user.side('linen', user.make_mesh()).abstract_state
  rng = np.random.default_rng(0)
  state = jax.tree.map(
      lambda a: jax.device_put(rng.standard_normal(a.shape).astype(a.dtype), a.sharding)
      if np.issubdtype(a.dtype, np.floating) else jax.device_put(np.full(a.shape, 7, a.dtype), a.sharding),
      abstract,
  )
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / f'src-{layout}', state)
  return tmp_path / f'src-{layout}'


# Nightly, both cases (marked here, whatever CI_EVERY_NTH says). CI: a scanned
# checkpoint streamed into a looped one, every leaf checked against the source
# (test_convert.py::test_converted_checkpoint_restores_with_the_other_sides_ordinary_code[nnx-True-nnx-loop-adam]),
# a looped Linen one stacked into a scanned Linen one ([linen-False-linen-scan-adam]),
# stacks written a layer per chunk (test_unchanged_chunks_move_as_their_bytes_and_stacks_keep_a_layer_per_chunk),
# the zoo transformer's scanned state streamed into its looped port, every
# layer sliced and computed (test_what_a_write_was_given_is_let_go_before_the_disk_is_done[scan]),
# and the in-memory writer across frameworks and layouts, bit for bit
# (test_convert.py::test_round_trip_is_the_identity, back in memory).
@pytest.mark.parametrize('layout, to, target_layout', [
    # slices of chunks that hold every layer: decoded, once each
    pytest.param('scan', 'nnx', 'loop', marks=pytest.mark.nightly),
    # a stack within Linen, through NNX
    pytest.param('loop', 'linen', 'scan', marks=pytest.mark.nightly),
])
def test_streaming_writes_what_the_in_memory_conversion_writes(tmp_path, layout, to, target_layout):
  src = _zoo_state(tmp_path, layout)
  models = dict(
      linen_model=zoo.linen_transformer, nnx_model=zoo.nnx_transformer,
      paths=zoo.TRANSFORMER_PATHS, rules=zoo.TRANSFORMER_RULES, optimizer=zoo.make_tx,
  )
  convert_checkpoint(
      src, tmp_path / 'streamed', to, models=models_for(**models), layout=target_layout,
      options=CheckpointOptions(memory_budget=2**20),
  )
  convert_checkpoint(
      src, tmp_path / 'in-memory', to, models=models_for(**models), layout=target_layout,
      options=CheckpointOptions(in_memory=True),
  )
  assert_same_checkpoint(tmp_path / 'streamed', tmp_path / 'in-memory')


def test_a_msgpack_source_streams_like_an_orbax_one(tmp_path):
  from flax.training import checkpoints as flax_checkpoints

  _, state = write_checkpoint(tmp_path / 'orbax')
  flax_checkpoints.save_checkpoint(tmp_path / 'flax', jax.device_get(state), step=2, orbax_checkpointer=None)
  convert_checkpoint(tmp_path / 'flax', tmp_path / 'from-msgpack', 'nnx', layout='scan', models=KitModels())
  convert_checkpoint(tmp_path / 'orbax', tmp_path / 'from-orbax', 'nnx', layout='scan', models=KitModels())
  assert_same_checkpoint(tmp_path / 'from-msgpack', tmp_path / 'from-orbax')


def _dropping_a_listed_array(path):
  """`_METADATA` as a disk that lost one of its entries leaves it."""
  import json

  with open(path / '_METADATA') as f:
    content = json.load(f)
  del content['tree_metadata']["('model', 'layers', '1', 'w2', 'value')"]
  with open(path / '_METADATA', 'w') as f:
    json.dump(content, f)


def _reshaping_an_array(path):
  """The zarr metadata of one array, rewritten with another shape."""
  import json

  store = ts.KvStore.open({'driver': 'ocdbt', 'base': f'file://{path}/'}).result()
  key = b'model.layers.1.w2.value/.zarray'
  zarr = json.loads(store.read(key).result().value)
  zarr['shape'] = [zarr['shape'][0] * 2, *zarr['shape'][1:]]
  store.write(key, json.dumps(zarr).encode()).result()


@pytest.mark.parametrize('damage, message', [
    (_dropping_a_listed_array, r'does not hold the converted tree at \[model/layers/1/w2/value\];'),
    (_reshaping_an_array, r'does not hold the converted tree at \[model/layers/1/w2/value\] \(another shape'),
])
def test_written_metadata_that_lost_or_changed_an_array_fails_verification(tmp_path, monkeypatch, damage, message):
  from converters.checkpoint.orbax_files import CheckpointWriter
  from converters.errors import VerificationError

  write_metadata = CheckpointWriter.write_metadata

  def damaged(self, *args, **kwargs):
    write_metadata(self, *args, **kwargs)
    damage(pathlib.Path(self.path))

  write_checkpoint(tmp_path / 'src')
  monkeypatch.setattr(CheckpointWriter, 'write_metadata', damaged)
  with pytest.raises(VerificationError, match=message):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=KitModels())
  assert sorted(os.listdir(tmp_path)) == ['src']


# Every chunk moved (loop: nightly), every layer sliced and computed (scan, whose
# embeddings, norms and step are moved chunks too: both release paths in CI).
@pytest.mark.parametrize('layout', [pytest.param('loop', marks=pytest.mark.nightly), 'scan'])
def test_what_a_write_was_given_is_let_go_before_the_disk_is_done(tmp_path, monkeypatch, layout):
  # TensorStore copies a chunk as its write starts (a computed block once it
  # has encoded it): keeping ours until the disk is done would hold it twice.
  src = _zoo_state(tmp_path, layout)
  read_chunks, write_chunks, write = (
      SourceCheckpoint.read_chunks, CheckpointWriter.write_chunks, CheckpointWriter.write
  )
  still_held = []

  class Tracked(bytearray):  # bytes cannot be weakly referenced
    pass

  async def tracked_read_chunks(self, chunks):
    return [Tracked(data) for data in await read_chunks(self, chunks)]

  def tracked_write_chunks(self, chunks):
    written, given = write_chunks(self, chunks), [weakref.ref(data) for _, _, data in chunks]

    async def wait():
      await written  # the checksum's worker thread lets go of its block some time before
      still_held.append(sum(ref() is not None for ref in given))

    return wait()

  async def tracked_write(self, array, region, values):
    written, given = await write(self, array, region, values), weakref.ref(values)

    async def wait():
      await written  # TensorStore lets go of it once copied, some time before
      still_held.append(int(given() is not None))

    return wait()

  monkeypatch.setattr(SourceCheckpoint, 'read_chunks', tracked_read_chunks)
  monkeypatch.setattr(CheckpointWriter, 'write_chunks', tracked_write_chunks)
  monkeypatch.setattr(CheckpointWriter, 'write', tracked_write)
  convert_checkpoint(
      src, tmp_path / 'dst', 'nnx',
      models=models_for(linen_model=zoo.linen_transformer, nnx_model=zoo.nnx_transformer, paths=zoo.TRANSFORMER_PATHS, rules=zoo.TRANSFORMER_RULES, optimizer=zoo.make_tx),
      layout='loop',
  )
  assert len(still_held) > 10 and not any(still_held)


def test_a_failed_checksum_still_waits_for_its_chunks_writes(tmp_path, monkeypatch):
  write_checkpoint(tmp_path / 'src')
  write_chunks = CheckpointWriter.write_chunks
  started, ended = [], []

  def tracked_write_chunks(self, chunks):
    written = write_chunks(self, chunks)
    started.append(len(chunks))

    async def wait():
      await written
      ended.append(len(chunks))

    return wait()

  async def failing_crcs(data):
    raise MemoryError('no memory left for the checksum')

  monkeypatch.setattr(CheckpointWriter, 'write_chunks', tracked_write_chunks)
  monkeypatch.setattr(streaming, '_crcs', failing_crcs)
  with pytest.raises(MemoryError):
    convert_checkpoint(tmp_path / 'src', tmp_path / 'dst', 'nnx', models=KitModels())
  assert started and sorted(ended) == sorted(started)  # no write outlived the conversion
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_at_most_the_budget_is_in_flight_and_a_larger_job_runs_alone():
  in_flight, peak, order = [0], [0], []

  async def run(cost):
    in_flight[0] += cost
    peak[0] = max(peak[0], in_flight[0])
    await asyncio.sleep(0.001 * (cost % 7))
    in_flight[0] -= cost
    order.append(cost)
    return cost * 2

  costs = [3, 5, 2, 8, 1, 30, 4, 4, 6]
  results = asyncio.run(streaming._bounded(costs, 10, run, lambda c: c))
  assert results == [c * 2 for c in costs]  # in the order given
  assert sorted(order) == sorted(costs)
  assert peak[0] == 30  # the job over the budget, alone; every other moment <= 10


def test_a_failing_job_is_raised_once_every_started_job_has_ended():
  ended = []

  async def run(cost):
    await asyncio.sleep(0.001 * cost)
    ended.append(cost)
    if cost == 2:
      raise CheckpointError('chunk 2 is missing')
    return cost

  with pytest.raises(CheckpointError, match='chunk 2 is missing'):
    asyncio.run(streaming._bounded([1, 2, 3, 4, 5, 6], 6, run, lambda c: c))
  assert 2 in ended and len(ended) < 6  # stopped starting new jobs


@pytest.mark.parametrize('budget', [0, 2**19, True, 1.5e9])
def test_a_memory_budget_below_a_mib_or_not_an_int_is_refused(tmp_path, budget):
  with pytest.raises(CheckpointError, match='memory_budget=.*at least 1 MiB'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx', options=CheckpointOptions(memory_budget=budget), models=KitModels(),
    )


def test_a_memory_budget_for_the_in_memory_path_is_refused(tmp_path):
  # It would bound nothing: the in-memory path restores the state whole.
  write_checkpoint(tmp_path / 'src')
  with pytest.raises(CheckpointError, match=r'memory_budget=1073741824 bounds the streaming .* give one of them'):
    convert_checkpoint(
        tmp_path / 'src', tmp_path / 'dst', 'nnx',
        options=CheckpointOptions(in_memory=True, memory_budget=2**30), models=KitModels(),
    )
  assert sorted(os.listdir(tmp_path)) == ['src']


def test_reading_a_region_counts_every_source_chunk_it_decodes():
  import types

  from converters.checkpoint.orbax_files import StoredArray
  from converters.checkpoint.recipes import Made, Stored

  array = StoredArray('w', (8, 128), np.dtype('float32'), (2, 16))  # 4 x 8 chunks of 128 B
  source = types.SimpleNamespace(arrays={('w',): array})
  stored = Stored(('w',), (8, 128), np.dtype('float32'))
  assert streaming._read_bytes(stored, ((0, 8), (0, 128)), source) == 32 * 128
  assert streaming._read_bytes(stored, ((1, 3), (15, 17)), source) == 2 * 2 * 128  # straddles 2 x 2
  # One layer of a stack whose chunks hold two layers decodes its chunks whole.
  layer = Made(relayout_ops.Slice(5), (stored,), (128,), np.dtype('float32'))
  assert streaming._read_bytes(layer, ((0, 128),), source) == 8 * 128


def test_the_share_of_each_process_is_contiguous_disjoint_and_complete():
  chunks = [streaming.Chunk(('a',), (i,), ((i, i + 1),), None, cost) for i, cost in enumerate([5, 1, 1, 9, 2, 2, 3, 8])]
  shares = [streaming.share(chunks, p, 3) for p in range(3)]
  assert [c for s in shares for c in s] == chunks
  assert all(shares)
