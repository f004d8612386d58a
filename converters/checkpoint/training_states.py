"""Whole training states, as the implementations save them, across frameworks.

A Linen training state is a `TrainState`; an NNX one is the `nnx.State` of
`{'model': ..., 'optimizer': ...}` (`nnx_impl.train.train_state`). `convert`
moves one into the other framework and layout through `linen_to_nnx` /
`nnx_to_linen`, filling the target trainer's abstract state; within one
framework it goes through the other one, which copies nothing when the layout
stays. Arrays whose layout does not change are the input arrays.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from converters.api import linen_to_nnx, nnx_to_linen
from converters.checkpoint import kit  # noqa: F401  (registers the kit SGD's state)
from converters.paths import Framework
from converters.presets import KIT_PATHS


def linen_to_nnx_state(
    state, nnx_trainer, scan: bool | None, layer_partition: str | None, donate: bool = False
):
  """A Linen `TrainState` as the NNX training state `nnx_trainer` saves."""
  from nnx_impl.train import train_state

  abstract = nnx.merge(nnx_trainer.graphdef, nnx_trainer.abstract_state)
  model, optimizer = linen_to_nnx(
      state,
      target=(abstract['model'], abstract['optimizer']),
      scan=scan,
      layer_partition=layer_partition,
      donate=donate,
      paths=KIT_PATHS,
  )
  return train_state(model, optimizer)


def nnx_to_linen_state(
    state: nnx.State, nnx_trainer, linen_trainer, scan: bool | None,
    layer_partition: str | None, donate: bool = False,
):
  """An NNX training state of `nnx_trainer` as the `TrainState` of `linen_trainer`."""
  objects = nnx.merge(nnx_trainer.graphdef, state)
  return nnx_to_linen(
      (objects['model'], objects['optimizer']),
      target=linen_trainer.abstract_state,
      scan=scan,
      layer_partition=layer_partition,
      donate=donate,
      paths=KIT_PATHS,
  )


def convert(
    state: Any,
    source: Framework,
    source_trainer,
    target: Framework,
    target_trainer,
    other_trainer=None,
    donate: bool = False,
) -> Any:
  """`state` (of `source_trainer`) as the training state `target_trainer` saves.

  Args:
    state: a `TrainState` (Linen) or an `nnx.State` (NNX).
    source, target: the frameworks.
    source_trainer, target_trainer: the trainers of the two states; the
      target's description gives the layout and layer partition.
    other_trainer: when `source == target`, a trainer of the other framework
      with the target's description, to convert through.
    donate: delete the arrays of `state` that are relaid as soon as their
      replacements exist (see `linen_to_nnx`); `state` must not be used after.
  """
  desc = target_trainer.desc
  scan, partition = desc.use_scan, desc.layer_partition
  if source == 'linen' and target == 'nnx':
    return linen_to_nnx_state(state, target_trainer, scan, partition, donate)
  if source == 'nnx' and target == 'linen':
    return nnx_to_linen_state(state, source_trainer, target_trainer, scan, partition, donate)
  if other_trainer is None:
    raise ValueError('converting within one framework needs other_trainer')
  # The second step keeps the layout: it copies and deletes nothing.
  if source == 'linen':
    middle = linen_to_nnx_state(state, other_trainer, scan, partition, donate)
    return nnx_to_linen_state(middle, other_trainer, target_trainer, None, partition)
  middle = nnx_to_linen_state(state, source_trainer, other_trainer, scan, partition, donate)
  return linen_to_nnx_state(middle, target_trainer, None, partition)


def start_from_linen(linen_trainer, nnx_trainer, seed: int = 0) -> tuple[Any, dict]:
  """A new Linen `TrainState` and the NNX training-state arrays converted from it.

  Linen and NNX draw different values from one seed, so to train both from
  identical parameters one side must come from the other. The NNX arrays are
  copies: a conversion shares Linen's buffers, and training donates them.
  Call with the trainers' mesh in context.
  """
  linen_state = linen_trainer.create(seed=seed)
  converted = linen_to_nnx_state(linen_state, nnx_trainer, None, None)
  return linen_state, jax.tree.map(jnp.copy, nnx.to_pure_dict(converted))
