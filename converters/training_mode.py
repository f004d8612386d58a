"""Both models in training mode, drawing the same random keys.

`model.train()` puts every layer of an NNX port in training; a Linen model
has no such switch (each model names its own flag: `train`,
`deterministic`, `use_running_average`). `linen_in_training` does for
Flax's Linen layers what `.train()` does for NNX's: `Dropout` and the
attention layers' dropout draw, `BatchNorm` normalises by the batch.

Linen derives a key from the module's path (`make_rng`), NNX from the
stream a layer holds (an `nnx.Dropout` built from `nnx.Rngs(0)` draws from a
fork tagged `default`, not `dropout`): the two never draw alike.
`linen_draws_in_order` and `nnx_draws_in_order` make the n-th key drawn
during a call `fold_in(KEY, n)` on either side, whatever stream it comes
from, so a port that draws in the original's order draws its keys, and
what dropout does (where, with which `broadcast_dims`, how many times) is
compared by its effect. A port that draws in another order (branches
evaluated the other way round) draws other keys: its training-mode outputs
differ, and a check says so rather than pass.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator

import jax
from flax import linen as nn
from flax import nnx
from flax.core import scope as linen_scope
from jax.extend import core as jcore

from converters import compat

#: Seed of the key the n-th draw of a call folds its n into, on both sides.
DRAW_SEED = 0x5EED

#: The attribute (and call argument) that puts each of Flax's Linen layers
#: in training, with its value in training.
_LINEN_TRAINING = (
    (nn.Dropout, 'deterministic', False),
    (nn.MultiHeadDotProductAttention, 'deterministic', False),
    (nn.BatchNorm, 'use_running_average', False),
)


def linen_in_training(next_fun, args, kwargs, context):
  """An interceptor (`nn.intercept_methods`) that runs Flax's Linen layers
  in training whatever their flag says, built in or given at the call
  (`nn.Dropout(...)(x, deterministic=not train)`): as `model.train()` puts
  an NNX port's layers, where a flag is an attribute. Subclasses too
  (`nn.SelfAttention`), where their call takes the flag; one with a call of
  its own that does not is left as it is."""
  if context.method_name != '__call__':
    return next_fun(*args, **kwargs)
  for kind, attribute, value in _LINEN_TRAINING:
    if not isinstance(context.module, kind):
      continue
    signature = inspect.signature(type(context.module).__call__)
    if attribute not in signature.parameters:
      break
    # Linen takes the flag built in or at the call, never both
    # (`merge_param`): cleared on the module for this call, given here.
    bound = signature.bind(context.module, *args, **kwargs)
    bound.arguments[attribute] = value
    built = getattr(context.module, attribute)
    object.__setattr__(context.module, attribute, None)
    try:
      return next_fun(*bound.args[1:], **bound.kwargs)
    finally:
      object.__setattr__(context.module, attribute, built)
  return next_fun(*args, **kwargs)


@contextlib.contextmanager
def _counted_keys() -> Iterator[Callable[[], jax.Array]]:
  """The n-th call of the function yielded returns `fold_in(KEY, n)`. A
  method NNX's transforms decorated once (`@nnx.remat` on `__call__`) is
  traced through one function, which JAX's trace caches would answer for at
  its next call, its draws skipped: after a draw in such a function they
  miss (`compat.trace_caches_missed`)."""
  count = [0]
  with compat.trace_caches_missed() as drew:

    def next_key() -> jax.Array:
      key = jax.random.fold_in(jax.random.key(DRAW_SEED), count[0])
      count[0] += 1
      drew()
      return key

    yield next_key


@contextlib.contextmanager
def patched(owner, name: str, value) -> Iterator[None]:
  """`owner.<name>` is `value` within the context, what it was after."""
  original = getattr(owner, name)
  setattr(owner, name, value)
  try:
    yield
  finally:
    setattr(owner, name, original)


@contextlib.contextmanager
def linen_draws_in_order() -> Iterator[None]:
  """Within the context, Linen's n-th `make_rng` of any stream but
  `params` (counted from its start) returns `fold_in(key(DRAW_SEED), n)`.
  Keys split under a lifted transform are drawn once, at its trace."""
  original = linen_scope.Scope.make_rng
  with _counted_keys() as next_key:

    @functools.wraps(original)
    def make_rng(scope, name: str = 'params'):
      return original(scope, name) if name == 'params' else next_key()

    with patched(linen_scope.Scope, 'make_rng', make_rng):
      yield


@contextlib.contextmanager
def nnx_draws_in_order() -> Iterator[None]:
  """Within the context, the n-th key any `RngStream` of the model draws
  (its `Rngs`', the forks its layers keep, and their copies inside NNX's
  transforms, which `nnx.remat` or `nnx.scan` merge anew) is
  `fold_in(key(DRAW_SEED), n)`, as `linen_draws_in_order` makes Linen draw.
  A stream built during the call (`nnx.Rngs(dropout=0)`, a seed of its own)
  draws its own keys: a port that ignores the model's streams is not given
  the original's."""
  original_call, original_init = nnx.RngStream.__call__, nnx.RngStream.__init__
  built: dict[int, nnx.RngStream] = {}  # held, so that no other stream takes a freed id

  @functools.wraps(original_init)
  def init(stream, *args, **kwargs):
    built[id(stream)] = stream
    return original_init(stream, *args, **kwargs)

  with _counted_keys() as next_key:

    @functools.wraps(original_call)
    def draw(stream):
      return original_call(stream) if id(stream) in built else next_key()

    with patched(nnx.RngStream, '__init__', init), patched(nnx.RngStream, '__call__', draw):
      yield


def runs_a_scan(closed) -> bool:
  """Whether a traced program (a closed jaxpr) runs a `scan`, in it or in a
  call or branch it holds. Under a scan the draws cannot align: a scan
  draws its layers' keys once, at its trace, and Linen's `nn.scan` traces
  its body twice, counting each draw twice."""
  for eqn in closed.jaxpr.eqns:
    if eqn.primitive.name == 'scan':
      return True
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(inner, jcore.ClosedJaxpr) and runs_a_scan(inner):
          return True
        if isinstance(inner, jcore.Jaxpr) and runs_a_scan(jcore.ClosedJaxpr(inner, ())):
          return True
  return False
