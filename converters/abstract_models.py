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

A plain array attribute (`self.table = jnp.asarray(...)`, not an
`nnx.Variable`) created under `nnx.eval_shape` keeps the creation's tracer:
the model cannot run or be converted, so `eval_shape` refuses it, naming it.

`made_values` gives a few of an abstract model's arrays real values (state
only the port has, which a conversion keeps as the model makes it), made
under `jax.jit` so that nothing else of the model is materialised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
from flax import nnx

from converters import compat
from converters.errors import StructureError
from converters.paths import format_path

__all__ = ['eval_shape']

T = TypeVar('T')

#: How to fix a port that keeps state Linen computes (a constant table, a
#: mask) as a plain array attribute.
PLAIN_ARRAY_FIX = (
    'compute it in __call__ as the Linen model does (a constant table, a mask); or '
    'give it as a numpy array (np.asarray: created abstractly it keeps its shape, and '
    'the checkpoint tool makes its value) or hold it in an nnx.Variable, and add the '
    "rule PathRule.nnx_only('<its path>') to keep the target's value"
)


def eval_shape(create: Callable[[], T], *, rerun_on_error: bool = True) -> T:
  """`nnx.eval_shape(create)`, in time linear in what `create` makes.

  Raises what `nnx.eval_shape(create)` raises. With `rerun_on_error` (for a
  caller that shows the error), a failed creation runs again unguarded, so
  the error carries JAX's full message; without it, it is raised as it came.
  """
  try:
    with compat.quiet_tracer_origins():
      return without_tracers(nnx.eval_shape(create))
  except StructureError:
    raise
  except Exception as e:
    _refuse_leaked(e)
    if not rerun_on_error:
      raise
  # Outside the handler: the error raised again carries its own context only.
  try:
    return without_tracers(nnx.eval_shape(create))
  except StructureError:
    raise
  except Exception as e:
    _refuse_leaked(e)
    raise


def made_values(create: Callable[[], Any], paths: Sequence[tuple], shardings=None) -> list[jax.Array]:
  """The values at `paths` of the state of what `create` makes (a model, or
  `{'model': ..., 'optimizer': ...}`), computed under `jax.jit`: the compiler
  drops every other array `create` makes, so nothing else is materialised.

  Values are those of a jitted computation, which may differ from an eager
  creation's in the last bits. `shardings`: one per path, or None.
  """
  def values() -> list:
    made = dict(nnx.to_flat_state(nnx.state(create())))
    return [made[p].get_raw_value() if isinstance(made[p], nnx.Variable) else made[p] for p in paths]

  with compat.quiet_tracer_origins():
    return jax.jit(values, out_shardings=shardings)()


def with_made_values(model: T, create: Callable[[], T], paths: Sequence[tuple]) -> T:
  """`model` (abstract, from `eval_shape(create)`) holding the values `create`
  makes at `paths` (`made_values`): Variables, or array attributes (a numpy
  mask, abstract in `model`); the rest stays abstract."""
  if not paths:
    return model
  leaves = dict(nnx.to_flat_state(nnx.state(model)))
  attributes = []
  for path, value in zip(paths, made_values(create, paths)):
    if isinstance(leaves[path], nnx.Variable):
      leaves[path].set_raw_value(value)
    else:
      attributes.append((path, value))
  if attributes:
    nnx.update(model, nnx.from_flat_state(attributes))
  return model


def abstract_attributes(model) -> list[tuple]:
  """The paths of `model`'s array attributes (not Variables) that it holds
  abstractly (a numpy mask an `nnx.eval_shape` creation left as its shape)."""
  return [
      tuple(p) for p, v in nnx.to_flat_state(nnx.state(model))
      if not isinstance(v, nnx.Variable) and isinstance(v, jax.ShapeDtypeStruct)
  ]


def _refuse_leaked(e: Exception) -> None:
  """Raises `StructureError` for what a plain array attribute made abstractly
  does to the next creation of its class: JAX compares the tracer it kept."""
  cause = e.__cause__ or e.__context__
  if not isinstance(cause, jax.errors.UnexpectedTracerError):
    return
  found = re.search(r'created on line (\S+) \(([^)]+)\)', str(cause))
  where = f' ({found.group(2)}, {found.group(1)})' if found else ''
  raise StructureError(
      f'probably a plain array attribute, not an nnx.Variable, made abstractly{where}: '
      'nnx.eval_shape keeps the tracer of its creation (a cached jnp value does the '
      'same), so the model cannot be created abstractly again, nor converted',
      fix=PLAIN_ARRAY_FIX,
  ) from e


def without_tracers(made: T) -> T:
  """`made`, refused if an attribute holds a tracer of its creation (a model
  the user made with `nnx.eval_shape` is checked so too)."""
  leaked = [
      format_path(path) for path, value in nnx.graph.iter_graph(made)
      if isinstance(value, jax.core.Tracer)
  ]
  if leaked:
    raise StructureError(
        f'{", ".join(leaked)}: a plain array attribute, not an nnx.Variable: created '
        'abstractly (nnx.eval_shape) it holds no value, so the model cannot be converted',
        leaked,
        fix=PLAIN_ARRAY_FIX,
    )
  return made
