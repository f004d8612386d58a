"""Small training-state checkpoints of both implementations, for the checkpoint tests.

`write_checkpoint` trains a few steps (so optimizer moments are not zeros)
and saves with the implementation's own `save`; `tree_checksum` fingerprints
a directory or file so tests can prove SRC was never modified.
"""

from __future__ import annotations

import hashlib
import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from converters.data import make_batches
from converters.description import ModelDescription
from converters.optimizers import make_tx
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


def leaves(state) -> list[jax.Array]:
  if isinstance(state, nnx.State):
    return jax.tree.leaves(nnx.to_pure_dict(state))
  return jax.tree.leaves(state)


def assert_bit_identical(a, b) -> None:
  la, lb = leaves(a), leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    assert x.shape == y.shape and x.dtype == y.dtype
    assert x.sharding == y.sharding, (x.sharding, y.sharding)
    assert bool(jnp.array_equal(x, y))


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
