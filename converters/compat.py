"""Workarounds for defects of the libraries the kit runs on, each until upstream mends it.

Every workaround of the kit lives here, named for what it guards, with the
versions it was found on (jax 0.10.2, flax 0.12.8, orbax-checkpoint 0.12.8)
and the upstream report. Each has a test in `tests/converters/test_compat.py`
that checks the defect is still there: when an upgrade mends it, that test
fails, and the workaround goes.

- `quiet_tracer_origins()`: a tracer probed for `.sharding` (NNX does it at
  every `Variable` update under a trace) raises an `AttributeError` whose
  message walks every equation traced so far, so `nnx.eval_shape` of a large
  model is quadratic in its number of variables (jax-ml/jax#40041).
- `to_nnx_metadata(box)`: Flax's `LogicallyPartitioned.to_nnx_metadata()` pops
  `names` and `rules` out of the box it is called on (flax/linen/spmd.py).
- `ignore_stray_orbax_callbacks()`: Orbax closes its event loop as soon as a
  read fails, and TensorStore reads still in flight print `RuntimeError('Event
  loop is closed')` as unraisable, tens of tracebacks around one error (not
  reported upstream yet; a race, so its test checks the guard, not the defect).
- `source_line(eqn)`: JAX has no public accessor of where a jaxpr equation
  was traced from (its `source_info` traceback is internal); the line of the
  model's own code is what a refusal names.
- `SHARD_MAP_P`, `RESHARD_P`, `PVARY_P`, `OPTIMIZATION_BARRIER_P`,
  `STACK_P`, `TILE_P`: JAX exports most primitives in
  `jax.extend.core.primitives`, not these (jax 0.10.2,
  `jax._src.shard_map.shard_map_p`, `jax._src.pjit.reshard_p`,
  `jax._src.core.pvary_p`, and `optimization_barrier_p`, `stack_p`,
  `tile_p` of `jax._src.lax.lax`), which inference tells apart by identity
  (`converters.inference.jaxprs`, `dataflow`).
- `one_ceiling_form()`: JAX writes a 'SAME' window's output size two ways,
  `-floordiv(-s, k)` (`padtype_to_pads`) and `floordiv(s - 1, k) + 1` (a
  window of 1, its padding simplified away), and cannot tell they are equal
  for a symbolic `s`: a ResNet unit adding its strided 1x1 projection to its
  strided 3x3 path fails `jax.export` shape checks, so the port wrote the
  traced image size (jax 0.10.2, `jax._src.lax.lax._ceil_divide`; not
  reported upstream yet).
- `unfiltered_tracebacks()`: an exception crossing a JAX API boundary has its
  traceback filtered, each frame's file compared with each of JAX's ~27
  excluded directories by `os.path.samefile` (two `stat`s each), whether or
  not anyone reads it: writing a port, which expects and catches an
  exception at each symbolic size it tries (`shapes`), spent a tenth of its
  time there (jax 0.10.2, `jax._src.traceback_util._path_starts_with`; not
  reported upstream yet).
- `distributed_client()`: JAX has no public accessor of the coordination
  service client that `jax.distributed.initialize` starts (Orbax reaches it
  the same way).
- `backends_are_initialized()`: JAX has no public way to tell whether its
  backends have started without starting them (`jax.devices()` would; jax
  0.10.2, `jax._src.xla_bridge.backends_are_initialized`), which
  `simulate_cpu_devices` must know: the device count is read once, then.
- `orbax_internals()`: Orbax has no public API that writes a checkpoint array
  by array and chunk by chunk, nor reads one's tree metadata without opening
  every array, so `converters.checkpoint.orbax_files` builds and reads
  Orbax's own files with Orbax's own private classes (its tree, array and
  sharding metadata, its kvstore spec and chunk choices; orbax-checkpoint
  0.12.8, `orbax.checkpoint._src`), here alone, each with what is missing
  from the public API; the names it needs that Orbax exports are read from
  `orbax.checkpoint` itself.
- `initializer_draws_as_zeros()`: JAX has no public way to trace an
  initializer for the shape and dtype of what it returns alone: every
  operation of its draw is traced (`truncated_normal`'s inverse error
  function; at symbolic sizes a fifth of a port's trace). JAX's initializers
  draw through the name `random` of `jax._src.nn.initializers` (jax 0.10.2),
  which the guard points at a namespace whose draws give zeros in a thread
  within it (Flax's layers wrap the initializers they are given, as
  `DenseGeneral` does, so the initializer itself cannot be swapped).
- `trace_caches_missed()`: JAX has no public switch that makes it trace a
  function again rather than answer from its trace caches (`jax.checkpoint`'s
  and `jit`'s are keyed on the function, the inputs' types and the trace
  context), so what a function does in Python while traced (a check drawing
  the n-th key) is skipped at every call of a method NNX's transforms
  decorated once (`@nnx.remat`, `@nnx.jit`) but the first. The guard changes
  a setting of the trace context that changes no program: the regex
  rewriting source file names in HLO metadata, set to one that matches
  nothing.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import itertools
import os
import sys
import threading
import types
from typing import Any

import flax
import jax
import numpy as np
from flax.core import tracers
from jax._src import config as _jax_config
from jax._src import core as _JAX_CORE
from jax._src import pjit as _PJIT
from jax._src import shard_map as _SHARD_MAP
from jax._src.interpreters import partial_eval
from jax._src.lax import lax as _LAX
from jax._src.nn import initializers as _INITIALIZERS

# JAX internals: if a later JAX renames them, the guard does nothing (and its
# test says so).
_TRACER = getattr(partial_eval, 'DynamicJaxprTracer', None)
_ORIGINAL_MESSAGE = getattr(_TRACER, '_origin_msg', None)
_CEILING_LOCK = threading.RLock()  # held through a block: nested ones re-enter

# (None where a later JAX moved one: nothing is then told apart by it, and
# its test says so.)
#: `shard_map`'s primitive: a jaxpr run on each device's shards.
SHARD_MAP_P = getattr(_SHARD_MAP, 'shard_map_p', None)
#: `jax.sharding.reshard`'s primitive: its operand, placed otherwise.
RESHARD_P = getattr(_PJIT, 'reshard_p', None)
#: The primitive marking a value varying over a `shard_map`'s axes: its operand.
PVARY_P = getattr(_JAX_CORE, 'pvary_p', None)
#: `lax.optimization_barrier`'s primitive: its operands, unchanged.
OPTIMIZATION_BARRIER_P = getattr(_LAX, 'optimization_barrier_p', None)
#: `jnp.stack`'s primitive (arrays stacked along a new axis).
STACK_P = getattr(_LAX, 'stack_p', None)
#: `jnp.tile`'s primitive.
TILE_P = getattr(_LAX, 'tile_p', None)


class ThreadScopedPatch:
  """A patch of a library, installed while any thread is within one of its
  blocks (counted: the first installs it, the last undoes it), whose
  patched code asks `active()`: whether the calling thread is within one."""

  def __init__(self, install, undo):
    self._install, self._undo = install, undo
    self._lock = threading.Lock()
    self._blocks = 0  # in any thread
    self._local = threading.local()  # `.depth`: this thread's

  def active(self) -> bool:
    return getattr(self._local, 'depth', 0) > 0

  @contextlib.contextmanager
  def __call__(self):
    with self._lock:
      if self._blocks == 0:
        self._install()
      self._blocks += 1
    depth = getattr(self._local, 'depth', 0)
    self._local.depth = depth + 1
    try:
      yield
    finally:
      self._local.depth = depth
      with self._lock:
        self._blocks -= 1
        if self._blocks == 0:
          self._undo()


def _origin_message(tracer) -> str:
  if _QUIET_ORIGINS.active():
    return ''
  return _ORIGINAL_MESSAGE(tracer)


_QUIET_ORIGINS = ThreadScopedPatch(
    lambda: setattr(_TRACER, '_origin_msg', _origin_message),
    lambda: setattr(_TRACER, '_origin_msg', _ORIGINAL_MESSAGE),
)


@contextlib.contextmanager
def quiet_tracer_origins():
  """JAX's tracer-origin messages skipped on this thread, for the block.

  Other threads keep JAX's full messages, and so does this one once the
  block ends; nothing else changes.
  """
  if _ORIGINAL_MESSAGE is None:
    yield
    return
  with _QUIET_ORIGINS():
    yield


def to_nnx_metadata(box) -> dict[str, Any]:
  """`box.to_nnx_metadata()` of a copy: the user's box keeps its fields."""
  return copy.copy(box).to_nnx_metadata()


def ignore_stray_orbax_callbacks() -> None:
  """Drops the unraisable `RuntimeError('Event loop is closed')` of reads Orbax left in flight.

  Every other unraisable exception reaches the previous hook. Install it
  before the first Orbax read: the callbacks can come before the read returns.
  Installing it again does nothing.
  """
  previous = sys.unraisablehook
  if getattr(previous, 'ignores_stray_orbax_callbacks', False):
    return

  def hook(unraisable):
    if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == 'Event loop is closed':
      return
    previous(unraisable)

  hook.ignores_stray_orbax_callbacks = True
  sys.unraisablehook = hook


def _floor_form_ceil_divide(x1, x2):
  # ceil(x1 / x2) written as JAX writes a window of 1's output size.
  return np.floor_divide(np.subtract(x1, 1), x2) + 1


@contextlib.contextmanager
def one_ceiling_form():
  """'SAME' padding's output sizes written as `floordiv(s - 1, k) + 1`
  within the block (the same numbers: the ceiling of `s / k`), so JAX's
  symbolic shapes see two strided paths over one input agree. For symbolic
  traces, one thread at a time."""
  if getattr(_LAX, '_ceil_divide', None) is None:
    yield
    return
  with _CEILING_LOCK:
    original = _LAX._ceil_divide  # (in the lock: a block nested in this thread restores the patch)
    _LAX._ceil_divide = _floor_form_ceil_divide
    try:
      yield
    finally:
      _LAX._ceil_divide = original


#: The draws of `jax.random` that JAX's initializers make, by name.
_INITIALIZER_DRAWS = ('normal', 'truncated_normal', 'uniform')
#: What JAX's initializers draw through (`jax._src.random`).
_REAL_RANDOM = getattr(_INITIALIZERS, 'random', None)


def _zeros_in_context(draw):
  signature = inspect.signature(draw)

  @functools.wraps(draw)
  def zeros_or_draw(*args, **kwargs):
    if _ZERO_DRAWS.active():
      bound = signature.bind(*args, **kwargs)
      bound.apply_defaults()
      shape = bound.arguments.get('shape')
      if shape is not None and bound.arguments.get('out_sharding') is None:
        return jax.numpy.zeros(shape, bound.arguments.get('dtype'))
    return draw(*args, **kwargs)

  return zeros_or_draw


@functools.cache
def _draws_as_zeros(real: types.ModuleType) -> types.SimpleNamespace:
  """`real` (`jax.random`) with the draws of `_INITIALIZER_DRAWS` giving
  zeros in a thread within `initializer_draws_as_zeros`."""
  draws = types.SimpleNamespace(**{name: getattr(real, name) for name in dir(real) if not name.startswith('__')})
  for name in _INITIALIZER_DRAWS:
    setattr(draws, name, _zeros_in_context(getattr(real, name)))
  return draws


@contextlib.contextmanager
def initializer_draws_as_zeros():
  """Within the context, on this thread, the draws of JAX's initializers
  (`jax.nn.initializers`, Flax's included, however a layer wraps them)
  give zeros of the shape and dtype they would draw: for traces that keep
  only shapes and dtypes (`jax.eval_shape` of an `init`). Other threads'
  draw as before; JAX's module is as it was once no thread is within one."""
  if not all(callable(getattr(_REAL_RANDOM, name, None)) for name in _INITIALIZER_DRAWS):
    yield
    return
  with _ZERO_DRAWS():
    yield


_ZERO_DRAWS = ThreadScopedPatch(
    lambda: setattr(_INITIALIZERS, 'random', _draws_as_zeros(_REAL_RANDOM)),
    lambda: setattr(_INITIALIZERS, 'random', _REAL_RANDOM),
)


#: The setting `trace_caches_missed` changes, set for this thread only (as
#: its context manager sets it): part of every trace cache's key, read only
#: to rewrite file names in HLO metadata.
_CACHE_KEYED_SETTING = getattr(_jax_config, 'hlo_source_file_canonicalization_regex', None)
_CACHE_MISSES = itertools.count()


@contextlib.contextmanager
def trace_caches_missed():
  """Within the context, JAX's trace caches miss what was traced before it,
  on this thread; JAX's setting is as it was on exit. The function it
  yields is called after each draw of a key: drawn under a trace nested in
  the one the context began in (a function JAX may answer from a cache at
  its next call: `jax.jit`, `jax.checkpoint`, NNX's and Linen's
  transforms), the caches miss from then on, and that function is traced
  again. A draw in the context's own trace needs no miss, and makes none:
  each miss retraces every function called after it."""
  with contextlib.ExitStack() as settings:

    def miss() -> None:
      # `(?!)` matches nothing: file names are left as they are.
      settings.enter_context(_CACHE_KEYED_SETTING(f'(?!)miss{next(_CACHE_MISSES)}'))

    miss()
    began_in = tracers.current_trace()

    def drew() -> None:
      if tracers.current_trace() != began_in:
        miss()

    yield drew


#: JAX's setting of how tracebacks are filtered; its context manager sets it
#: for this thread only.
_TRACEBACK_FILTERING = getattr(_jax_config, 'traceback_filtering', None)


@contextlib.contextmanager
def unfiltered_tracebacks():
  """Within the context, on this thread, exceptions cross JAX's API
  boundaries with their tracebacks as Python made them, JAX's frames
  included and without JAX's note on removing them (JAX's setting
  `jax_traceback_filtering='off'`); as before on exit. Only for code that
  catches the exceptions it expects and reads no traceback."""
  if _TRACEBACK_FILTERING is None:
    yield
    return
  with _TRACEBACK_FILTERING('off'):
    yield


def distributed_client():
  """The client `jax.distributed.initialize` started, or None."""
  from jax._src import distributed

  return distributed.global_state.client


@functools.cache
def orbax_internals() -> types.SimpleNamespace:
  """Orbax's private modules that the streaming checkpoint writer and reader
  use, by the name they go by there (imported on first use: Orbax is slow
  to import and only checkpoint commands need it)."""
  # What each is used for: `subchunking.choose_chunk_shape`, `array_metadata`
  # and its store, `empty_values.is_empty_typestr`, step metadata's JSON,
  # `sharding_metadata.from_jax_sharding`, `InternalTreeMetadata`,
  # `build_kvstore_tspec` and Orbax's zarr chunk metadata,
  # `get_param_typestr`.
  from orbax.checkpoint._src.arrays import subchunking
  from orbax.checkpoint._src.metadata import array_metadata, array_metadata_store, empty_values
  from orbax.checkpoint._src.metadata import sharding as sharding_metadata
  from orbax.checkpoint._src.metadata import step_metadata_serialization
  from orbax.checkpoint._src.metadata import tree as tree_metadata
  from orbax.checkpoint._src.serialization import tensorstore_utils, type_handler_registry

  return types.SimpleNamespace(
      array_metadata=array_metadata, array_metadata_store=array_metadata_store, empty_values=empty_values,
      sharding_metadata=sharding_metadata, step_metadata_serialization=step_metadata_serialization,
      subchunking=subchunking, tensorstore_utils=tensorstore_utils, tree_metadata=tree_metadata,
      type_handler_registry=type_handler_registry,
  )


def backends_are_initialized() -> bool:
  """Whether JAX's backends have started (and read their flags), without
  starting them."""
  from jax._src import xla_bridge

  return xla_bridge.backends_are_initialized()


#: Frames of these packages are the libraries' own, not the model's code.
_LIBRARY_DIRECTORIES = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (jax, flax)
) + (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def source_line(eqn, own_only: bool = False) -> str | None:
  """`file:line (function)` of the model's own code that traced `eqn` (the
  innermost frame outside JAX, Flax and the kit), else (unless `own_only`)
  of Flax's (a layer of theirs), else None (JAX 0.10.2:
  `eqn.source_info.traceback.frames`, innermost first)."""
  traceback = getattr(getattr(eqn, 'source_info', None), 'traceback', None)
  frames = list(getattr(traceback, 'frames', None) or ())
  jax_directory = _LIBRARY_DIRECTORIES[0]
  ours = [f for f in frames if not f.file_name.startswith(_LIBRARY_DIRECTORIES)]
  theirs = [] if own_only else [f for f in frames if not f.file_name.startswith(jax_directory)]
  for frame in (ours or theirs)[:1]:
    return f'{frame.file_name}:{frame.line_num} ({frame.function_name})'
  return None
