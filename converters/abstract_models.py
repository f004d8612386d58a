"""Creating a user's NNX model abstractly, in time linear in its size.

`eval_shape` is `nnx.eval_shape`, guarded against a defect of Flax 0.12 with
JAX 0.10 (`compat.quiet_tracer_origins`): every `Variable` update under a
trace (each `rngs()` call does one, `count[...] += 1`) asks the traced value
for `getattr(value, 'sharding', None)`, and the tracer's `AttributeError`
first builds a message that walks every equation traced so far. Creating a
model is then quadratic in its number of parameters: 36 s for a 52-block
transformer, 3 s without the message.

The message is skipped only for the thread running the creation and only while
it runs (other threads, and every error the user's factory raises, keep JAX's
full text: a creation that fails is run again unguarded, unless its caller
discards the error). Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from flax import nnx

from converters import compat

T = TypeVar('T')


def eval_shape(create: Callable[[], T], *, rerun_on_error: bool = True) -> T:
  """`nnx.eval_shape(create)`, in time linear in what `create` makes.

  Raises what `nnx.eval_shape(create)` raises. With `rerun_on_error` (for a
  caller that shows the error), a failed creation runs again unguarded, so
  the error carries JAX's full message; without it, it is raised as it came.
  """
  try:
    with compat.quiet_tracer_origins():
      return nnx.eval_shape(create)
  except Exception:
    if not rerun_on_error:
      raise
  # Outside the handler: the error raised again carries its own context only.
  return nnx.eval_shape(create)
