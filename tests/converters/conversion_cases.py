"""Trained Linen and NNX states of one description, shared by the converter tests."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from kit_mlp.data import make_batches
from kit_mlp.description import GUIDE_RULES, ModelDescription
from kit_mlp.optimizers import make_tx
from linen_impl import train as linen_train
from nnx_impl import train as nnx_train

STEPS = 4  # batches made per case: k steps on one side, the rest on the other


def description(annotation: str, use_scan: bool, rules=GUIDE_RULES, **kw) -> ModelDescription:
  logical = annotation == 'logical'
  return ModelDescription(
      num_layers=3,
      depth=64,
      batch=8,
      use_scan=use_scan,
      layer_partition='layer' if (logical and use_scan) else None,
      annotation=annotation,
      rules=rules if logical else GUIDE_RULES,
      mesh_shape=kw.pop('mesh_shape', (2, 4)),
      **kw,
  )


@functools.cache
def linen_trainer(desc: ModelDescription, optimizer: str):
  return linen_train.make_trainer(desc, desc.make_mesh(), make_tx(optimizer))


@functools.cache
def nnx_trainer(desc: ModelDescription, optimizer: str):
  return nnx_train.make_trainer(desc, desc.make_mesh(), optimizer)


@functools.cache
def batches(desc: ModelDescription):
  return make_batches(desc, desc.make_mesh(), STEPS, seed=1)


def copy(tree):
  return jax.tree.map(jnp.copy, tree)


def linen_trained(desc, optimizer: str, steps: int):
  """A fresh Linen TrainState after `steps` steps on the first batches."""
  trainer = linen_trainer(desc, optimizer)
  xs, ys = batches(desc)
  with jax.set_mesh(trainer.mesh):
    state = trainer.create(seed=0)
    if steps:
      state, _ = trainer.train_steps(state, xs[:steps], ys[:steps])
  return state


def nnx_trained(desc, optimizer: str, steps: int):
  """Fresh NNX `(model, optimizer)` after `steps` steps on the first batches."""
  trainer = nnx_trainer(desc, optimizer)
  xs, ys = batches(desc)
  with jax.set_mesh(trainer.mesh):
    arrays = trainer.create(seed=0)
    if steps:
      arrays, _ = trainer.train_steps(arrays, xs[:steps], ys[:steps])
  return trainer.merge(arrays)


def nnx_abstract(desc, optimizer: str):
  """Abstract `(model, optimizer)` (ShapeDtypeStruct values) to convert into."""
  trainer = nnx_trainer(desc, optimizer)
  objects = nnx.merge(trainer.graphdef, trainer.abstract_state)
  return objects['model'], objects['optimizer']


def nnx_arrays(model, optimizer):
  return nnx.to_pure_dict(nnx_train.train_state(model, optimizer))
