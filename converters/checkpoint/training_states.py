"""Whole training states, as Flax training loops save them, across frameworks.

A Linen training state is a `TrainState` (a subclass's extra fields, such as
`batch_stats`, are collections); an NNX one is the `nnx.State` of `{'model':
..., 'optimizer': ...}`. `convert` moves one into the other framework and
layout through `linen_to_nnx` / `nnx_to_linen`, filling the target side's
abstract state (`converters.checkpoint.sides.Side`); within one framework it
goes through the other one, which copies nothing when the layout stays.
Arrays whose layout does not change are the input arrays. Weights only take
the same way, read into and written from their standard forms
(`converters.checkpoint.weights`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
from flax import linen as nn
from flax import nnx

from converters.api import linen_to_nnx, nnx_to_linen
from converters.flat_trees import keys_of
from converters.checkpoint import weights
from converters.checkpoint.sides import CheckpointPlan, Side
from converters.paths import format_path


def _scan(source: Side, target: Side) -> bool | None:
  """The `scan=` that takes `source`'s layout to `target`'s (None: keep)."""
  if None in (source.layout, target.layout) or source.layout == target.layout:
    return None
  return target.layout == 'scan'


def _to_nnx(state, source: Side, target: Side, plan: CheckpointPlan, donate: bool, rngs) -> nnx.State:
  if source.weights:
    params_only = target.form == 'params'
    model = linen_to_nnx(
        state, target=target.objects()[0], scan=_scan(source, target),
        layer_partition=target.layer_partition, donate=donate, paths=plan.paths,
        rngs=None if params_only else rngs, collections=plan.collections,
        wrt=nnx.Param if params_only else None,
    )
    return weights.written(target, model)
  model, optimizer = linen_to_nnx(
      state,
      target=target.objects(),
      scan=_scan(source, target),
      layer_partition=target.layer_partition,
      donate=donate,
      paths=plan.paths,
      rngs=rngs,
      collections=plan.collections,
  )
  return nnx.state({'model': model, 'optimizer': optimizer})


def _to_linen(state, source: Side, target: Side, plan: CheckpointPlan, donate: bool):
  if source.weights:
    converted = nnx_to_linen(
        state, target=weights.linen_template(target),
        scan=_scan(source, target), layer_partition=target.layer_partition, donate=donate,
        paths=plan.paths, collections=plan.collections,
    )
    return weights.written(target, converted)
  return nnx_to_linen(
      source.objects(state),
      target=target.abstract_state,
      scan=_scan(source, target),
      layer_partition=target.layer_partition,
      donate=donate,
      paths=plan.paths,
      collections=plan.collections,
  )


def convert(state: Any, plan: CheckpointPlan, donate: bool = False, rngs: Any = 0) -> Any:
  """`state` (of `plan.source`) as the training state of `plan.target`.

  Args:
    state: a `TrainState` (Linen) or an `nnx.State` (NNX); real, or the
      source's abstract state (a dry run that checks everything and reads
      nothing).
    plan: the sides; `plan.other` when source and target share a framework.
    donate: delete the arrays of `state` that are relaid as soon as their
      replacements exist (see `linen_to_nnx`); `state` must not be used after.
    rngs: seeds for the RNG streams of an NNX target (dropout keys), as
      `linen_to_nnx` takes them: Linen has none. From an NNX source, every
      RNG variable the target has at the same path, shape and dtype keeps the
      source's value (`rng_state` says which); only the others are seeded.

  Call with the plan's mesh in context; the plan's rules are put in context.
  """
  source, target = plan.source, plan.target
  if source.weights:  # read into its standard form: every form converts from there
    state, source = weights.standard(source, state), weights.standardized(source)
  with nn.logical_axis_rules(plan.rules) if plan.rules else contextlib.nullcontext():
    if source.framework == 'linen' and target.framework == 'nnx':
      return _to_nnx(state, source, target, plan, donate, rngs)
    if source.framework == 'nnx' and target.framework == 'linen':
      return _to_linen(state, source, target, plan, donate)
    other = plan.other
    if other is None:
      raise ValueError('converting within one framework needs plan.other')
    # The second step keeps the layout: it copies and deletes nothing. State
    # the other framework has not (RNG state, one-sided state) keeps the
    # source's values where the target holds it alike.
    if source.framework == 'linen':
      middle = _to_nnx(state, source, other, plan, donate, rngs)
      result = _to_linen(middle, other, target, plan, False)
      if target.weights:
        return weights.written(target, _keep_linen_only(weights.standard(target, result), state, plan))
      return _keep_linen_only(result, state, plan)
    kept = set(rng_state(plan)[0]) | set(nnx_only_kept(plan))
    sources = {p: v for p, v in nnx.to_flat_state(state) if format_path(p) in kept}
    middle = _to_linen(state, source, other, plan, donate)
    return _keep_rng_state(_to_nnx(middle, other, target, plan, False, rngs), sources)


def _rng_leaves(side: Side) -> dict[str, tuple]:
  """`{path: (shape, dtype)}` of the RNG state `side` holds, by its stored paths."""
  if side.weights and side.form == 'params':
    return {}
  model, optimizer = side.objects()
  state = nnx.state(model if side.weights else {'model': model, 'optimizer': optimizer}, nnx.RngState)
  return {
      format_path(p): (v.get_raw_value().shape, v.get_raw_value().dtype)
      for p, v in nnx.to_flat_state(state)
  }


def _own_leaves(side: Side, plan: CheckpointPlan) -> dict[str, tuple]:
  """`{path: (shape, dtype)}` of the state only NNX has (a one-sided rule
  names it) that `side` holds, by its stored paths."""
  if side.weights and side.form == 'params':
    return {}
  prefix = () if side.weights else ('model',)
  state = side.standard if side.weights else side.abstract_state
  return {
      format_path(p): (v.get_raw_value().shape, v.get_raw_value().dtype)
      for p, v in nnx.to_flat_state(state)
      if tuple(p[:len(prefix)]) == prefix and plan.paths.only('nnx', tuple(p[len(prefix):]))
  }


def nnx_only_kept(plan: CheckpointPlan) -> list[str]:
  """The state only NNX has that an NNX target keeps from an NNX source (same
  path, shape and dtype); the rest the target's factory makes."""
  if plan.target.framework != 'nnx' or plan.source.framework != 'nnx':
    return []
  have = _own_leaves(plan.source, plan)
  return sorted(p for p, leaf in _own_leaves(plan.target, plan).items() if have.get(p) == leaf)


def _keep_linen_only(converted, source_state, plan: CheckpointPlan):
  """`converted` (Linen, from a Linen source through NNX) holding the source's
  values of the state only Linen has, where it holds it alike."""
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  value = lambda x: x.value if is_box(x) else x

  def only(keypath) -> bool:
    keys = keys_of(keypath)
    return keys[0] not in ('opt_state', 'step') and plan.paths.only('linen', keys[1:])

  have = {
      k: x for k, x in jax.tree_util.tree_flatten_with_path(source_state, is_leaf=is_box)[0] if only(k)
  }
  if not have:
    return converted

  def kept(keypath, x):
    y = have.get(keypath)
    same = y is not None and (value(y).shape, value(y).dtype) == (value(x).shape, value(x).dtype)
    return (x.replace_boxed(value(y)) if is_box(x) else value(y)) if same else x

  return jax.tree_util.tree_map_with_path(kept, converted, is_leaf=is_box)


def rng_state(plan: CheckpointPlan) -> tuple[list[str], list[str]]:
  """`(kept, seeded)`: the RNG variables (`nnx.RngState`) of an NNX target that
  keep the NNX source's values, and those seeded from `rngs` (all of them
  from a Linen source, which has none; a relayout changes their shapes)."""
  if plan.target.framework != 'nnx':
    return [], []
  wanted = _rng_leaves(plan.target)
  have = _rng_leaves(plan.source) if plan.source.framework == 'nnx' else {}
  kept = sorted(p for p, leaf in wanted.items() if have.get(p) == leaf)
  return kept, sorted(set(wanted) - set(kept))


def rng_dropped(plan: CheckpointPlan) -> list[str]:
  """The RNG variables of an NNX source that a Linen target has no place for."""
  if plan.source.framework != 'nnx' or plan.target.framework != 'linen':
    return []
  return sorted(_rng_leaves(plan.source))


def _keep_rng_state(state: nnx.State, sources: dict) -> nnx.State:
  """`state` with the RNG variables at the paths of `sources` taking their values."""
  return nnx.from_flat_state([
      (p, v.replace(sources[p].get_raw_value()) if p in sources else v)
      for p, v in nnx.to_flat_state(state)
  ])
