"""Orbax save and restore of the NNX model and optimizer state.

What is saved is the `nnx.State` of `{'model': ..., 'optimizer': ...}` (see
`nnx_impl.train.train_state`; `NNXTrainer.to_state` makes it from the arrays
the jitted functions pass around); restoring takes the trainer's abstract state,
made with `nnx.get_abstract_model` and holding sharded `ShapeDtypeStruct`s, so
every array is read straight into its shards.
"""

from __future__ import annotations

import os

import orbax.checkpoint as ocp
from flax import nnx

from nnx_impl.train import NNXTrainer


# [side-by-side: checkpoint]
def save(path: str | os.PathLike, state: nnx.State) -> None:
  """Writes `state` to the new directory `path` and waits until it is complete."""
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.abspath(path), state)
    checkpointer.wait_until_finished()
# [/side-by-side]


# [side-by-side: checkpoint]
def restore_target(trainer: NNXTrainer) -> nnx.State:
  """The abstract state whose `ShapeDtypeStruct`s carry their shardings."""
  return trainer.abstract_state
# [/side-by-side]


# [side-by-side: checkpoint]
def restore(path: str | os.PathLike, trainer: NNXTrainer) -> nnx.State:
  """Reads the state at `path` into `trainer`'s abstract state and shardings."""
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(os.path.abspath(path), restore_target(trainer))
# [/side-by-side]
