"""What each array of a converted checkpoint is made of, from a dry run of the conversion.

The in-memory conversion (`converters.checkpoint.training_states.convert`) run
on the source's abstract training state checks everything and computes
nothing; run inside `converters.provenance.recording()`, it also says how each
leaf of the target would be made. `recipes` turns that into a `Recipe` per
target leaf, a small expression over the source checkpoint's stored arrays:
`Stored` (a source array as it is), `Made` (a stack of layers, one layer's
slice, a counter cast to another dtype, a rule's transform) and `Constant`
(a value the conversion makes itself, such as a seeded NNX RNG key). The
streaming conversion (`converters.checkpoint.streaming`) carries the recipes
out from disk to disk, so it follows the in-memory conversion's plan exactly,
whatever the models, without knowing any of them.

Shapes and dtypes are those stored: a PRNG key array as its key data.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

import jax
import numpy as np

from converters import provenance, relayout_ops
from converters.checkpoint import training_states
from converters.checkpoint.inspect import stored_form, string_path
from converters.checkpoint.sides import CheckpointPlan
from converters.errors import CheckpointError

Leaf = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Stored:
  """A source array as it is stored."""

  leaf: Leaf
  shape: tuple[int, ...]
  dtype: np.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Constant:
  """A value the conversion makes itself (a seeded RNG key), as stored."""

  value: np.ndarray
  key_impl: str | None = None  # a PRNG key array's implementation, stored as its key data

  @property
  def shape(self) -> tuple[int, ...]:
    return self.value.shape

  @property
  def dtype(self) -> np.dtype:
    return self.value.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Made:
  """An array made from others by a relayout operation (`converters.relayout_ops`)
  and a rule's transform, or none (see `converters.provenance.Derivation`)."""

  op: relayout_ops.Operation
  inputs: tuple['Recipe', ...]
  shape: tuple[int, ...]
  dtype: np.dtype
  transform: Any = None


Recipe = Union[Stored, Constant, Made]


def _stored_form(value) -> tuple[tuple[int, ...], np.dtype]:
  shape, dtype = stored_form(value)
  return shape, np.dtype(dtype)


def _constant(value: jax.Array, where: str) -> Constant:
  key_impl = None
  if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
    key_impl = str(jax.random.key_impl(value))
    value = jax.random.key_data(value)
  if value.is_fully_addressable:
    return Constant(np.asarray(value), key_impl)
  if value.sharding.is_fully_replicated:
    return Constant(np.asarray(value.addressable_data(0)), key_impl)
  raise CheckpointError(
      f'{where}: the conversion makes it as an array this process holds only part '
      'of; convert with options=CheckpointOptions(in_memory=True) (--in-memory)',
      [where],
  )


def recipes(plan: CheckpointPlan, rngs: Any = 0) -> tuple[Any, dict[Leaf, Recipe]]:
  """`(target, {leaf: recipe})`: the target's abstract training state (with
  its shardings) and how each of its stored leaves is made.

  Raises what the in-memory conversion raises for the same plan (unmapped
  paths, annotations, layouts), before anything is read.
  """
  source = plan.source.abstract_state
  stored = {
      id(value): (string_path(keypath), value)
      for keypath, value in jax.tree_util.tree_flatten_with_path(source)[0]
  }
  with jax.set_mesh(plan.mesh), provenance.recording() as recorder:
    target = training_states.convert(source, plan, rngs=rngs)

  def recipe(value, where: str) -> Recipe:
    found = stored.get(id(value))
    if found is not None and found[1] is value:
      return Stored(found[0], *_stored_form(value))
    derivation = recorder.derivation(value)
    if derivation is not None:
      inputs = tuple(recipe(v, where) for v in derivation.inputs)
      shape, dtype = _stored_form(value)
      return Made(derivation.op, inputs, shape, dtype, derivation.transform)
    if isinstance(value, jax.Array):
      return _constant(value, where)
    raise CheckpointError(  # a conversion step that does not record what it makes
        f'{where}: the conversion makes it in a way the streaming conversion cannot '
        'follow; convert with options=CheckpointOptions(in_memory=True) (--in-memory) and report this',
        [where],
    )

  made = {}
  for keypath, value in jax.tree_util.tree_flatten_with_path(target)[0]:
    leaf = string_path(keypath)
    made[leaf] = recipe(value, '/'.join(leaf))
  return target, made
