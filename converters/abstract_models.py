"""Creating a user's NNX model abstractly, in time linear in its size.

`eval_shape` is `nnx.eval_shape`, guarded against a defect of Flax 0.12 with
JAX 0.10: every `Variable` update under a trace (each `rngs()` call does one,
`count[...] += 1`) asks the traced value for `getattr(value, 'sharding', None)`.
A tracer has no `sharding`; the `AttributeError` it raises first builds JAX's
"this value became a tracer due to ..." message, which walks every equation
traced so far. Creating a model is then quadratic in its number of parameters:
36 s for a 52-block transformer, 3 s without the message.

The message is skipped only for the thread running the creation and only while
it runs (other threads, and every error the user's factory raises, keep JAX's
full text: a creation that fails is run again unguarded, unless its caller
discards the error). Nothing else changes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

from flax import nnx
from jax._src.interpreters import partial_eval

T = TypeVar('T')

# JAX internals: if a later JAX renames them, the guard does nothing.
_TRACER = getattr(partial_eval, 'DynamicJaxprTracer', None)
_ORIGINAL_MESSAGE = getattr(_TRACER, '_origin_msg', None)
_LOCK = threading.Lock()
_INSTALLED = 0
_THIS_THREAD = threading.local()


def _origin_message(tracer) -> str:
  if getattr(_THIS_THREAD, 'quiet', False):
    return ''
  return _ORIGINAL_MESSAGE(tracer)


@contextlib.contextmanager
def _without_origin_messages():
  """JAX's tracer-origin messages skipped on this thread, for the block."""
  global _INSTALLED
  if _ORIGINAL_MESSAGE is None:
    yield
    return
  with _LOCK:
    if _INSTALLED == 0:
      _TRACER._origin_msg = _origin_message
    _INSTALLED += 1
  previous = getattr(_THIS_THREAD, 'quiet', False)
  _THIS_THREAD.quiet = True
  try:
    yield
  finally:
    _THIS_THREAD.quiet = previous
    with _LOCK:
      _INSTALLED -= 1
      if _INSTALLED == 0:
        _TRACER._origin_msg = _ORIGINAL_MESSAGE


def eval_shape(create: Callable[[], T], *, rerun_on_error: bool = True) -> T:
  """`nnx.eval_shape(create)`, in time linear in what `create` makes.

  Raises what `nnx.eval_shape(create)` raises. With `rerun_on_error` (for a
  caller that shows the error), a failed creation runs again unguarded, so
  the error carries JAX's full message; without it, it is raised as it came.
  """
  try:
    with _without_origin_messages():
      return nnx.eval_shape(create)
  except Exception:
    if not rerun_on_error:
      raise
  # Outside the handler: the error raised again carries its own context only.
  return nnx.eval_shape(create)
