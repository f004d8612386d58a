"""Tests of `converters.abstract_models`: the guarded `nnx.eval_shape` makes what
Flax's makes, without walking the trace per Variable update, and changes
nothing for errors or for other threads."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src.interpreters import partial_eval

from converters import abstract_models, compat
from tests.converters.test_compat import origin_walks
from tests.helpers import mesh

MESH_AXES = ('data', 'model')


class Stack(nnx.Module):
  """Annotated layers and per-layer random streams: many `rngs()` updates."""

  def __init__(self, depth: int, rngs: nnx.Rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, 'model'))
    self.layers = nnx.List(
        [nnx.Linear(8, 8, kernel_init=init, rngs=rngs) for _ in range(depth)]
    )
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    self.norm = nnx.LayerNorm(8, rngs=rngs)


def _leaves(state):
  return [
      (path, type(v), v.get_metadata(), v.get_value().shape, v.get_value().dtype,
       getattr(v.get_value(), 'sharding', None))
      for path, v in nnx.to_flat_state(state)
  ]


def test_makes_what_flax_makes():
  with jax.set_mesh(mesh((1, 2))):
    ours = abstract_models.eval_shape(lambda: Stack(6, nnx.Rngs(0, dropout=1)))
    flax_own = nnx.eval_shape(lambda: Stack(6, nnx.Rngs(0, dropout=1)))
  (ours_def, ours_state), (flax_def, flax_state) = nnx.split(ours), nnx.split(flax_own)
  assert ours_def == flax_def
  assert _leaves(ours_state) == _leaves(flax_state)
  assert any(isinstance(s, jax.sharding.NamedSharding) for *_, s in _leaves(ours_state))


def test_no_walk_over_the_trace_per_variable_update(monkeypatch):
  walks = origin_walks(monkeypatch)
  with jax.set_mesh(mesh((1, 2))):
    nnx.eval_shape(lambda: Stack(4, nnx.Rngs(0)))
    assert walks, 'Flax no longer asks tracers for .sharding: the guard can go'
    walks.clear()
    abstract_models.eval_shape(lambda: Stack(4, nnx.Rngs(0)))
  assert walks == []
  assert partial_eval.DynamicJaxprTracer._origin_msg is compat._ORIGINAL_MESSAGE


def _concretizes():
  x = jnp.ones(3) * 2
  return nnx.Param(np.zeros(int(x.sum())))  # a tracer made concrete: the user's bug


def test_a_failing_factory_raises_flax_own_error_with_jax_full_message():
  with pytest.raises(jax.errors.ConcretizationTypeError) as flax_own:
    nnx.eval_shape(_concretizes)
  with pytest.raises(jax.errors.ConcretizationTypeError) as ours:
    abstract_models.eval_shape(_concretizes)
  assert 'This value became a tracer due to JAX operations' in str(flax_own.value)
  assert str(ours.value) == str(flax_own.value)
  assert partial_eval.DynamicJaxprTracer._origin_msg is compat._ORIGINAL_MESSAGE


def test_a_caller_that_discards_the_error_runs_the_factory_once():
  calls = []

  def failing():
    calls.append(1)
    return _concretizes()

  with pytest.raises(jax.errors.ConcretizationTypeError):
    abstract_models.eval_shape(failing, rerun_on_error=False)
  assert len(calls) == 1
  with pytest.raises(jax.errors.ConcretizationTypeError):
    abstract_models.eval_shape(failing)
  assert len(calls) == 3  # the second time, again unguarded for JAX's message
  assert partial_eval.DynamicJaxprTracer._origin_msg is compat._ORIGINAL_MESSAGE


def test_other_threads_keep_jax_full_messages():
  seen = []

  def elsewhere():
    try:
      jax.eval_shape(_concretizes)
    except jax.errors.ConcretizationTypeError as e:
      seen.append(str(e))

  def create():
    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    return Stack(2, nnx.Rngs(0))

  with jax.set_mesh(mesh((1, 2))):
    abstract_models.eval_shape(create)
  assert len(seen) == 1 and 'This value became a tracer due to JAX operations' in seen[0]


def test_nested_creations_restore_jax_on_the_way_out():
  def create():
    inner = abstract_models.eval_shape(lambda: Stack(1, nnx.Rngs(1)))
    return {'inner': inner, 'outer': Stack(1, nnx.Rngs(0))}

  with jax.set_mesh(mesh((1, 2))):
    made = abstract_models.eval_shape(create)
  assert made['inner'].layers[0].kernel.shape == (8, 8)
  assert partial_eval.DynamicJaxprTracer._origin_msg is compat._ORIGINAL_MESSAGE


class _WithTable(nnx.Module):
  """A port that keeps a table Linen computes on the fly as a plain array attribute."""

  def __init__(self, table=None, mask=None):
    self.table = jnp.sin(jnp.arange(8.0)) if table is None else table
    self.mask = jnp.ones(3) * 2 if mask is None else mask
    self.dense = nnx.Linear(8, 8, rngs=nnx.Rngs(0))


def test_a_plain_array_attribute_made_abstractly_is_refused_naming_it():
  from converters.errors import StructureError

  with pytest.raises(StructureError, match=r'^mask, table: a plain array attribute') as e:
    abstract_models.eval_shape(_WithTable)
  assert e.value.paths == ('mask', 'table') and 'compute it in __call__' in str(e.value)
  # Made again, JAX meets the tracer the first creation kept: named the same.
  with pytest.raises(StructureError, match=r'a plain array attribute, not an nnx.Variable, made abstractly \(_WithTable.__init__'):
    abstract_models.eval_shape(_WithTable)


def test_a_plain_array_given_from_outside_is_data_made_abstract():
  table, mask = np.arange(8.0), jnp.ones(3)
  model = abstract_models.eval_shape(lambda: _WithTable(table, mask))
  assert isinstance(model.table, jax.ShapeDtypeStruct) and model.mask.shape == (3,)
