"""Small training-state checkpoints of both implementations, for the checkpoint tests.

`write_checkpoint` trains a few steps (so optimizer moments are not zeros)
and saves with the implementation's own `save`; `tree_checksum` fingerprints
a directory or file so tests can prove SRC was never modified.
"""

from __future__ import annotations

import hashlib
import os
import re

import jax
import numpy as np
import pytest
from flax import nnx

from converters.comparison import bits_equal, host_bits
from kit_mlp.data import make_batches
from kit_mlp.description import ModelDescription
from kit_mlp.optimizers import make_tx
from linen_impl import checkpoint as linen_checkpoint
from linen_impl import train as linen_train
from nnx_impl import checkpoint as nnx_checkpoint
from nnx_impl import train as nnx_train

DESC = ModelDescription(num_layers=2, depth=32, batch=8)


def trained_state(framework: str, desc: ModelDescription, optimizer: str, steps: int = 2):
  """`(trainer, state)` after `steps` steps: a `TrainState`, or an `nnx.State`."""
  mesh = desc.make_mesh()
  with jax.set_mesh(mesh):
    xs, ys = make_batches(desc, mesh, steps, seed=3)
    if framework == 'linen':
      trainer = linen_train.make_trainer(desc, mesh, make_tx(optimizer))
      state, _ = trainer.train_steps(trainer.create(seed=0), xs, ys)
      return trainer, state
    trainer = nnx_train.make_trainer(desc, mesh, optimizer)
    arrays, _ = trainer.train_steps(trainer.create(seed=0), xs, ys)
    return trainer, trainer.to_state(arrays)


def write_checkpoint(path, framework='linen', desc=DESC, optimizer='adam', steps=2):
  """Saves a trained state with the implementation's `save`; returns `(trainer, state)`."""
  trainer, state = trained_state(framework, desc, optimizer, steps)
  module = linen_checkpoint if framework == 'linen' else nnx_checkpoint
  module.save(path, state)
  return trainer, state


def write_unfinished_checkpoint(path, framework='linen', desc=DESC, optimizer='adam', steps=2):
  """Saves as Orbax does up to its last step, the commit: returns `(trainer, state, path)`.

  Orbax writes into `PATH.orbax-checkpoint-tmp`, then records the commit time
  and renames it; this stops before both, as a save still in progress (or
  killed) leaves it.
  """
  from orbax.checkpoint._src.path import atomicity

  async def no_commit(self, *args, **kwargs):
    del self, args, kwargs

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(atomicity.AtomicRenameTemporaryPath, 'finalize', no_commit)
    trainer, state = write_checkpoint(path, framework, desc, optimizer, steps)
  temporary = f'{path}.orbax-checkpoint-tmp'
  assert os.path.isdir(temporary) and not os.path.exists(path)
  return trainer, state, temporary


def flat(state) -> list[tuple[str, jax.Array]]:
  """`(path, array)` of every leaf; an `nnx.State` as its pure dict."""
  if isinstance(state, nnx.State):
    state = nnx.to_pure_dict(state)
  return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]]


def same_leaves(a, b) -> bool:
  """The same leaf paths, and bit-identical arrays (compared on device)."""
  fa, fb = flat(a), flat(b)
  return [p for p, _ in fa] == [p for p, _ in fb] and all(
      bits_equal([x for _, x in fa], [y for _, y in fb])
  )


def assert_bit_identical(a, b) -> None:
  """The same leaf paths, shapes, dtypes, shardings and bits (-0.0 is not 0.0)."""
  fa, fb = flat(a), flat(b)
  assert [p for p, _ in fa] == [p for p, _ in fb]
  for (path, x), (_, y) in zip(fa, fb):
    assert (x.shape, x.dtype) == (y.shape, y.dtype), path
    assert x.sharding == y.sharding, (path, x.sharding, y.sharding)
    assert np.array_equal(host_bits(x), host_bits(y)), f'{path} differs'


# Every array of either side's training state, named independently of
# `converters`: `(slot, layer, parameter)` with slot 'param' or a moment name.
_LINEN_ARRAY = re.compile(
    r"\.(?:params|opt_state\[0\]\.(\w+))\['(Scan)?DotReluDot_(\d+)'\]"
    r"\['(?:Dense_0'\]\['(kernel)|(W2))'\]\.value"
)
_NNX_ARRAY = re.compile(
    r"\['(?:model|optimizer'\](?:\['opt_state'\]\[0\])?\['(\w+))'\]\['layers'\]"
    r"(?:\[(\d+)\])?\['(?:dot1'\]\['(kernel)|(w2))'\]"
)
_SCALARS = {
    '.step': 'step', '.opt_state[0].count': 'count',
    "['optimizer']['step']": 'step', "['optimizer']['opt_state'][0]['count']": 'count',
}
_SLOTS = {None: 'param', 'ema': 'momentum'}  # fsdp_sgd: optax's ema is NNX's momentum


def by_layer(items) -> dict[tuple, np.ndarray]:
  """`{(slot, layer, param): array}` and `{(counter,): value}` of `(path, array)`
  pairs (see `flat`), stacks split by layer."""
  out = {}
  for path, x in items:
    x = np.asarray(jax.device_get(x))
    if path in _SCALARS:
      out[(_SCALARS[path],)] = int(x)
    elif m := _LINEN_ARRAY.fullmatch(path):
      slot, stacked, layer, kernel, w2 = m.groups()
      layers = enumerate(x) if stacked else [(int(layer), x)]
      out.update({(_SLOTS.get(slot, slot), i, (kernel or w2).lower()): a for i, a in layers})
    elif m := _NNX_ARRAY.fullmatch(path):
      slot, layer, kernel, w2 = m.groups()
      layers = enumerate(x) if layer is None else [(int(layer), x)]
      out.update({(_SLOTS.get(slot, slot), i, kernel or w2): a for i, a in layers})
    else:
      raise AssertionError(f'unexpected leaf {path}')
  return out


def assert_same_values_by_layer(source, converted) -> None:
  """Both `(path, array)` lists hold the same values, layer by layer, whatever
  their framework and layout."""
  a, b = by_layer(source), by_layer(converted)
  # NNX's hand-written SGD keeps no count; optax's ema counts the steps.
  if (('count',) in a) != (('count',) in b):
    for counts in (a, b):
      assert counts.pop(('count',), counts[('step',)]) == counts[('step',)]
  assert sorted(a) == sorted(b)
  for key in a:
    x, y = np.asarray(a[key]), np.asarray(b[key])
    assert (x.shape, x.dtype) == (y.shape, y.dtype), key
    assert x.tobytes() == y.tobytes(), f'{key} differs'


def tree_checksum(path) -> str:
  """SHA-256 over every file's relative path and bytes under `path`."""
  digest = hashlib.sha256()
  if os.path.isfile(path):
    with open(path, 'rb') as f:
      digest.update(f.read())
    return digest.hexdigest()
  for root, dirs, files in os.walk(path):
    dirs.sort()
    for name in sorted(files):
      full = os.path.join(root, name)
      digest.update(os.path.relpath(full, path).encode())
      with open(full, 'rb') as f:
        digest.update(f.read())
  return digest.hexdigest()
