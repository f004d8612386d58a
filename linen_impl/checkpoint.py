"""Orbax save and restore of the Linen `TrainState`.

The state is saved as it is, boxes included (their annotations are static pytree
fields, so only the arrays go to disk). Restoring takes the trainer's boxed
abstract state with its shardings, so every array is read straight into its
shards; nothing is loaded whole onto one device first.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax.training.train_state import TrainState

from linen_impl.train import LinenTrainer


# [side-by-side: checkpoint]
def save(path: str | os.PathLike, state: TrainState) -> None:
  """Writes `state` to the new directory `path` and waits until it is complete."""
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.abspath(path), state)
    checkpointer.wait_until_finished()
# [/side-by-side]


# [side-by-side: checkpoint]
def restore_target(trainer: LinenTrainer) -> TrainState:
  """The boxed abstract `TrainState` whose leaves carry their shardings."""
  # The sharding tree stops at the boxes; each of its leaves covers one box.
  return jax.tree.map(
      lambda s, boxed: jax.tree.map(
          lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), boxed
      ),
      trainer.sharding,
      trainer.abstract_state,
  )
# [/side-by-side]


# [side-by-side: checkpoint]
def restore(path: str | os.PathLike, trainer: LinenTrainer) -> TrainState:
  """Reads the `TrainState` at `path` into `trainer`'s shardings."""
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(os.path.abspath(path), restore_target(trainer))
# [/side-by-side]
