"""Tests of `converters.compat`: each workaround works, and each defect it guards
against is still upstream (the test that says so fails once an upgrade mends
it: then the workaround goes)."""

from __future__ import annotations

import os
import sys
import threading

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from jax._src.interpreters import partial_eval

from converters import compat


def origin_walks(monkeypatch) -> list[int]:
  """Counts the walks over the trace that JAX's origin messages make."""
  walks = []
  frame = partial_eval.JaxprStackFrame
  find = frame.find_progenitors
  monkeypatch.setattr(frame, 'find_progenitors', lambda self, t: walks.append(1) or find(self, t))
  return walks


def _trace_a_sharding_probe():
  """Traces a new function (so no cache answers) that asks a tracer for
  `.sharding`, as NNX does at each Variable update."""

  def probe(x):
    y = x * 2
    assert getattr(y, 'sharding', None) is None
    return y

  jax.make_jaxpr(probe)(jnp.ones(3))


def test_jax_still_walks_the_trace_when_a_tracer_is_probed_for_sharding(monkeypatch):
  walks = origin_walks(monkeypatch)
  _trace_a_sharding_probe()
  assert walks, 'JAX no longer walks the trace for .sharding (jax-ml/jax#40041): quiet_tracer_origins can go'


def test_quiet_tracer_origins_skips_the_walk_on_this_thread_only(monkeypatch):
  walks = origin_walks(monkeypatch)
  elsewhere = []

  def other_thread():
    try:
      jax.eval_shape(lambda: int((jnp.ones(3) * 2).sum()))  # a tracer made concrete
    except jax.errors.ConcretizationTypeError as e:
      elsewhere.append(str(e))

  _trace_a_sharding_probe()
  assert walks  # unguarded, the probe walks the trace
  walks.clear()
  with compat.quiet_tracer_origins():
    _trace_a_sharding_probe()
    assert walks == []
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
  assert len(elsewhere) == 1 and 'This value became a tracer due to JAX operations' in elsewhere[0]
  assert partial_eval.DynamicJaxprTracer._origin_msg is compat._ORIGINAL_MESSAGE


def test_quiet_tracer_origins_restores_jax_after_an_error():
  with pytest.raises(ValueError, match='raised inside'):
    with compat.quiet_tracer_origins():
      raise ValueError('raised inside')
  assert partial_eval.DynamicJaxprTracer._origin_msg is compat._ORIGINAL_MESSAGE


def test_flax_to_nnx_metadata_still_empties_a_logically_partitioned_box():
  box = nn.LogicallyPartitioned(jnp.zeros(2), ('embed',), rules=(('embed', 'model'),))
  box.to_nnx_metadata()
  assert not hasattr(box, 'names'), (
      'LogicallyPartitioned.to_nnx_metadata keeps its box: compat.to_nnx_metadata can go'
  )


def test_to_nnx_metadata_leaves_the_box_as_it_was():
  box = nn.LogicallyPartitioned(jnp.zeros(2), ('embed',), rules=(('embed', 'model'),))
  metadata = compat.to_nnx_metadata(box)
  assert metadata['out_sharding'] == ('embed',) and metadata['sharding_rules'] == (('embed', 'model'),)
  assert box.names == ('embed',) and box.rules == (('embed', 'model'),)


# Whether Orbax still leaves reads in flight is a race (seen in some runs of a
# failed read, not in others), so no test here can tell when it is mended;
# `tests/linen_nnx_cli/test_main_checkpoints.py` checks a failed read prints none.
def test_ignore_stray_orbax_callbacks_drops_them_and_nothing_else():
  seen = []
  previous = sys.unraisablehook
  sys.unraisablehook = seen.append
  try:
    compat.ignore_stray_orbax_callbacks()
    hook = sys.unraisablehook
    compat.ignore_stray_orbax_callbacks()
    assert sys.unraisablehook is hook  # installed once, not wrapped again
    hook(_Unraisable(RuntimeError('Event loop is closed')))
    other = _Unraisable(RuntimeError('something else'))
    hook(other)
  finally:
    sys.unraisablehook = previous
  assert seen == [other]


class _Unraisable:
  def __init__(self, exc_value):
    self.exc_value = exc_value


def test_jax_still_has_no_public_accessor_of_the_distributed_client():
  public = [name for name in dir(jax.distributed) if 'client' in name.lower()]
  assert public == [], f'jax.distributed now has {public}: use it in compat.distributed_client'
  assert compat.distributed_client() is None  # this process never initialized jax.distributed


def test_jax_still_has_no_public_way_to_tell_its_backends_have_started():
  from jax.extend import backend

  public = [name for name in dir(backend) if 'initiali' in name.lower()]
  assert public == [], f'jax.extend.backend now has {public}: use it in compat.backends_are_initialized'
  assert jax.device_count() == 8  # (started, if nothing in this process had)
  assert compat.backends_are_initialized()


# Where Orbax's public API would serve `orbax_internals()` once it exports
# what the checkpoint writer uses: each row fails the test below when one of
# those places holds the same object (the private module then goes from
# compat.py, and its users read the public name).
_ORBAX_PUBLIC_HOMES = [
    ('subchunking', 'choose_chunk_shape', ('arrays', 'utils')),
    ('array_metadata', 'ArrayMetadata', ('arrays', 'type_handlers')),  # metadata.ArrayMetadata: another class
    ('array_metadata_store', 'Store', ('metadata', 'metadata.metadata_store')),
    ('empty_values', 'is_empty_typestr', ('type_handlers', 'metadata', 'tree', 'utils')),
    ('sharding_metadata', 'from_jax_sharding', ('metadata',)),
    ('step_metadata_serialization', 'serialize', ('metadata', 'step')),
    ('tree_metadata', 'InternalTreeMetadata', ('metadata', 'metadata.tree', 'tree')),
    ('tensorstore_utils', 'build_kvstore_tspec', ('serialization', 'serialization.tensorstore_utils', 'type_handlers')),
    ('tensorstore_utils', '_build_zarr_shard_and_chunk_metadata', ('serialization.tensorstore_utils',)),
    ('type_handler_registry', 'get_param_typestr', ('type_handlers', 'utils')),
]


@pytest.mark.parametrize('module, name, homes', _ORBAX_PUBLIC_HOMES,
                         ids=[f'{m}.{n}' for m, n, _ in _ORBAX_PUBLIC_HOMES])
def test_orbax_still_keeps_private_what_the_checkpoint_writer_needs(module, name, homes):
  import functools

  import orbax.checkpoint as ocp

  private = getattr(getattr(compat.orbax_internals(), module), name)
  public = [home for home in homes
            if getattr(functools.reduce(lambda m, a: getattr(m, a, None), home.split('.'), ocp), name, None)
            is private]
  assert public == [], f'orbax.checkpoint.{public[0]}.{name} is public now: use it, and drop {module} from compat'


def test_the_names_orbax_exports_are_the_ones_the_writer_used_to_import():
  # Read from orbax.checkpoint: the same objects as the private modules', so
  # the files written are unchanged (StepMetadata names its handler's module).
  import orbax.checkpoint as ocp
  from orbax.checkpoint._src.handlers import standard_checkpoint_handler
  from orbax.checkpoint._src.metadata import checkpoint
  from orbax.checkpoint._src.serialization import ocdbt_utils
  from orbax.checkpoint._src.tree import utils

  assert ocp.StandardCheckpointHandler is standard_checkpoint_handler.StandardCheckpointHandler
  assert ocp.metadata.StepMetadata is checkpoint.StepMetadata
  assert ocp.type_handlers.merge_ocdbt_per_process_files is ocdbt_utils.merge_ocdbt_per_process_files
  assert ocp.tree.get_param_names is utils.get_param_names
  assert ocp.utils.is_empty_or_leaf is utils.is_empty_or_leaf


def test_no_module_but_compat_imports_orbax_or_jax_internals():
  import pathlib
  import re

  root = pathlib.Path(compat.__file__).parent.parent
  private = re.compile(r'^\s*(from|import) (orbax\.checkpoint(\._src| import _src)|jax(\._src| import _src))\b', re.M)
  found = [str(path.relative_to(root)) for package in ('converters', 'linen_nnx_cli')
           for path in (root / package).rglob('*.py') if private.search(path.read_text())]
  assert found == ['converters/compat.py']


class _StridedUnit(nn.Module):
  """A ResNet unit's two strided paths over one input, added."""

  @nn.compact
  def __call__(self, x):
    return nn.Conv(4, (1, 1), strides=(2, 2))(x) + nn.Conv(4, (3, 3), strides=(2, 2))(x)


def _symbolic_unit_shape():
  from jax import export

  b, s = export.symbolic_shape('b, s', constraints=['s >= 8'])
  x = jax.ShapeDtypeStruct((b, s, s, 3), jnp.float32)
  return jax.eval_shape(lambda x: _StridedUnit().init_with_output(jax.random.key(0), x)[0], x).shape


def test_jax_still_writes_a_same_windows_output_size_two_ways():
  with pytest.raises(TypeError):  # the shapes' check: `floordiv(s - 1, 2) + 1` vs `-floordiv(-s, 2)`
    _symbolic_unit_shape()


def test_one_ceiling_form_lets_two_strided_paths_agree_and_restores_jax():
  with compat.one_ceiling_form():
    shape = _symbolic_unit_shape()
  assert str(shape[1]) == 'floordiv(s - 1, 2) + 1'
  with pytest.raises(TypeError):  # JAX's own again after the block
    _symbolic_unit_shape()


def _initializers_program(dtype=jnp.bfloat16) -> tuple[str, list]:
  """The program (as text, inner programs included) of JAX's initializers
  (called directly, wrapped by Flax as `nn.with_partitioning` and
  `DenseGeneral` wrap them), and the shapes and dtypes of what they give."""
  def init(key):
    kernel = nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))(key, (3, 4), dtype)
    dense = nn.DenseGeneral((2, 3)).init(key, jnp.ones((1, 5)))
    return (kernel.value, nn.initializers.normal()(key, (2,), dtype), nn.initializers.uniform()(key, (2,), dtype),
            jax.nn.initializers.truncated_normal()(key, (4,), dtype), *jax.tree.leaves(dense))

  closed = jax.make_jaxpr(init)(jax.random.key(0))
  return str(closed), [(a.shape, a.dtype) for a in closed.out_avals]


def test_jax_s_initializers_still_draw_through_the_name_random_of_their_module():
  program, _ = _initializers_program()
  assert 'erf_inv' in program and 'random_bits' in program
  from jax._src import random
  from jax._src.nn import initializers

  assert initializers.random is random


def test_initializer_draws_as_zeros_gives_their_shapes_and_dtypes_on_its_thread_and_restores_jax():
  from jax._src.nn import initializers

  real = initializers.random
  _, drawn = _initializers_program()
  elsewhere = []
  with compat.initializer_draws_as_zeros():
    with compat.initializer_draws_as_zeros():  # nested: still zeros after the inner one ends
      program, zeros = _initializers_program()
    program, zeros = _initializers_program()
    assert zeros == drawn
    assert 'erf_inv' not in program and 'random_bits' not in program
    thread = threading.Thread(target=lambda: elsewhere.append(_initializers_program()[0]))
    thread.start()
    thread.join()
  assert 'erf_inv' in elsewhere[0]  # another thread draws as JAX does
  assert initializers.random is real
  with pytest.raises(ZeroDivisionError), compat.initializer_draws_as_zeros():
    raise ZeroDivisionError
  assert initializers.random is real
  assert 'erf_inv' in _initializers_program()[0]


def _checkpointed_layer():
  """One `jax.checkpoint`ed function (as `@nnx.remat` makes one for a
  method), and the list its every run in Python appends to."""
  ran = []

  @jax.checkpoint
  def layer(x):
    ran.append(1)
    return jnp.sin(x)

  return layer, ran


def test_jax_still_answers_a_trace_of_a_function_traced_alike_from_its_cache():
  layer, ran = _checkpointed_layer()
  jax.make_jaxpr(lambda x: layer(layer(x)))(jnp.ones(3))
  jax.make_jaxpr(layer)(jnp.ones(3))
  assert len(ran) == 1  # the second call and the second trace from the cache, unrun


def test_trace_caches_missed_traces_again_after_a_draw_in_a_nested_trace_and_restores_jax():
  layer, ran = _checkpointed_layer()
  program = lambda x: jnp.cos(layer(x)) * 2
  closed = jax.make_jaxpr(program)(jnp.ones(3))
  before = jax.config.jax_hlo_source_file_canonicalization_regex
  with compat.trace_caches_missed() as drew:
    assert str(jax.make_jaxpr(program)(jnp.ones(3))) == str(closed)  # the same program,
    assert len(ran) == 2  # traced again: what was traced before the context misses
    jax.make_jaxpr(lambda x: layer(layer(x)))(jnp.ones(3))
    assert len(ran) == 2  # no draw: the cache answers
    jax.make_jaxpr(lambda x: layer((layer(x), drew())[0]))(jnp.ones(3))
    assert len(ran) == 3  # a draw under a trace the context began outside: the second call traced again
  assert jax.config.jax_hlo_source_file_canonicalization_regex == before
  jax.make_jaxpr(program)(jnp.ones(3))
  assert len(ran) == 3  # JAX's setting back: the cache from before the context answers


def test_trace_caches_missed_makes_no_miss_for_a_draw_in_its_own_trace():
  layer, ran = _checkpointed_layer()

  def step(x, draw_in_layer: bool):
    with compat.trace_caches_missed() as drew:
      if draw_in_layer:
        inner = jax.checkpoint(lambda y: (drew(), layer(y))[1])
        return inner(layer(inner(x)))
      drew()  # in the trace the context began in: nothing cached holds it
      y = layer(x)
      drew()
      return layer(y)

  jax.make_jaxpr(lambda x: step(x, False))(jnp.ones(3))
  assert len(ran) == 1  # the layer's second call answered from the cache
  jax.make_jaxpr(lambda x: step(x, True))(jnp.ones(3))
  assert len(ran) == 3  # after each of the two draws in a nested trace, the layer traced again


def test_trace_caches_missed_keeps_to_its_thread_and_a_setting_given_there():
  from jax._src import config as jax_config

  layer, ran = _checkpointed_layer()
  setting = jax_config.hlo_source_file_canonicalization_regex
  before = jax.config.jax_hlo_source_file_canonicalization_regex
  seen_elsewhere = []
  with setting('users_own'):
    jax.make_jaxpr(layer)(jnp.ones(3))
    with compat.trace_caches_missed():
      jax.make_jaxpr(layer)(jnp.ones(3))
      assert len(ran) == 2  # missed under the user's own setting too
      thread = threading.Thread(
          target=lambda: seen_elsewhere.append(jax.config.jax_hlo_source_file_canonicalization_regex))
      thread.start()
      thread.join()
    assert jax.config.jax_hlo_source_file_canonicalization_regex == 'users_own'
  assert seen_elsewhere == [before]  # another thread's JAX untouched
  assert jax.config.jax_hlo_source_file_canonicalization_regex == before


def _samefile_calls_of_an_error_through_jit(monkeypatch) -> int:
  """How many times JAX called `os.path.samefile` while an exception raised
  in a jitted function crossed `jax.jit`'s boundary."""
  calls = []
  samefile = os.path.samefile
  monkeypatch.setattr(os.path, 'samefile', lambda a, b: (calls.append(a), samefile(a, b))[1])

  def fails(x):
    raise ValueError('expected')

  with pytest.raises(ValueError, match='expected'):
    jax.jit(fails)(jnp.ones(3))
  return len(calls)


def _filtered_as_by_default():
  """JAX's default filtering outside IPython, whatever the environment sets."""
  from jax._src import config as jax_config

  return jax_config.traceback_filtering('quiet_remove_frames')


def test_jax_still_compares_each_frames_file_when_it_filters_a_traceback(monkeypatch):
  with _filtered_as_by_default():
    assert _samefile_calls_of_an_error_through_jit(monkeypatch) > 0


def test_unfiltered_tracebacks_skips_the_filtering_on_this_thread_only_and_restores_jax(monkeypatch):
  before = jax.config.jax_traceback_filtering  # the process's, another thread's
  seen_elsewhere = []
  with _filtered_as_by_default():
    # (Restored after an error too.)
    with pytest.raises(ValueError, match='expected'), compat.unfiltered_tracebacks():
      assert _samefile_calls_of_an_error_through_jit(monkeypatch) == 0
      thread = threading.Thread(target=lambda: seen_elsewhere.append(jax.config.jax_traceback_filtering))
      thread.start()
      thread.join()
      raise ValueError('expected')
    assert jax.config.jax_traceback_filtering == 'quiet_remove_frames'
    assert _samefile_calls_of_an_error_through_jit(monkeypatch) > 0
  assert seen_elsewhere == [before]  # another thread's JAX untouched


def test_jax_still_keeps_the_primitives_inference_tells_apart_private():
  from jax.extend.core import primitives
  from jax.sharding import PartitionSpec as P

  public = [name for name in ('shard_map_p', 'reshard_p', 'pvary_p', 'optimization_barrier_p', 'stack_p', 'tile_p')
            if hasattr(primitives, name)]
  assert public == [], f'jax.extend.core.primitives now has {public}: use them in compat'
  mesh = jax.make_mesh((8,), ('x',), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh):
    traced = jax.make_jaxpr(lambda a: jax.shard_map(lambda b: b * 2, out_specs=P('x'))(
        jax.sharding.reshard(a, P('x'))))(jnp.ones(8))
  assert [e.primitive for e in traced.jaxpr.eqns] == [compat.RESHARD_P, compat.SHARD_MAP_P]
  barrier = jax.make_jaxpr(jax.lax.optimization_barrier)(jnp.ones(2))
  assert [e.primitive for e in barrier.jaxpr.eqns] == [compat.OPTIMIZATION_BARRIER_P]
  with jax.set_mesh(mesh):  # a replicated operand used beside a sharded one varies: `pvary`
    mapped = jax.make_jaxpr(lambda a, w: jax.shard_map(lambda b, v: b * v, out_specs=P('x'))(
        jax.sharding.reshard(a, P('x')), w))(jnp.ones(8), jnp.ones(()))
  body = mapped.jaxpr.eqns[-1].params['jaxpr']
  assert [e.primitive for e in body.eqns][0] is compat.PVARY_P
  (stack, tile) = jax.make_jaxpr(lambda a: jnp.tile(jnp.stack([a, a]), 2))(jnp.ones(2)).jaxpr.eqns
  assert (stack.primitive, tile.primitive) == (compat.STACK_P, compat.TILE_P)
