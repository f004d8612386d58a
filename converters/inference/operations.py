"""Each distinct operation of a traced program compiled once, ahead of a run, on every core.

Running a program operation by operation (`evaluation`) pays one XLA
compilation per distinct operation (primitive, parameters, operand shapes
and dtypes), and on a CPU that, not the arithmetic, is most of a witness
run. `Operations` compiles the operations a run will need before it starts:
each is lowered here (in the calling thread: lowering reads JAX's
thread-local configuration, set from the operation's own context) and
compiled on a pool of threads, one per core (XLA compiles without holding
the interpreter lock). What it compiles is what `primitive.bind` compiles
eagerly, one primitive jitted alone, so a run computes the same bits as
before, only sooner.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import jax

from converters.inference import jaxprs

#: How many compiled operations the process keeps (least recently used go first).
CAPACITY = 4096


class Literal:
  """A constant operand written into the program (a jaxpr `Literal`'s value)."""

  __slots__ = ('value',)

  def __init__(self, value: Any):
    self.value = value


def signature(eqn) -> Hashable | None:
  """What makes two operations compile alike: the primitive, its
  parameters, its context, and the shape, dtype and weak type of each
  operand (a `Literal`'s too: as eager `bind` does, its value is an argument
  at run time, not a constant XLA could fold). None where a parameter
  cannot be compared (the operation then runs as `bind` runs it)."""
  try:
    params = tuple(sorted(eqn.params.items()))
    hash(params)
  except TypeError:
    return None
  avals = (var.aval for var in eqn.invars)
  shapes = tuple((tuple(a.shape), str(a.dtype), bool(getattr(a, 'weak_type', False))) for a in avals)
  return (eqn.primitive, params, eqn.ctx, shapes)


def _lowered(eqn):
  """The operation jitted alone and lowered for its operands' shapes."""
  params = eqn.primitive.get_bind_params(eqn.params)

  def operation(*values):
    return eqn.primitive.bind(*values, **params)

  avals = [
      jax.ShapeDtypeStruct(var.aval.shape, var.aval.dtype, weak_type=bool(getattr(var.aval, 'weak_type', False)))
      for var in eqn.invars
  ]
  with eqn.ctx.manager:
    return jax.jit(operation).lower(*avals)


class Operations:
  """Compiled operations by `signature`, shared by every run in the process."""

  def __init__(self, capacity: int = CAPACITY):
    self._compiled: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
    self._capacity = capacity
    self._lock = threading.Lock()

  def prepare(self, eqns: Iterable[Any]) -> None:
    """Compile every operation of `eqns` not compiled yet, on one thread per core."""
    wanted: dict[Hashable, Any] = {}
    for eqn in eqns:
      key = signature(eqn)
      if key is not None and key not in self._compiled and key not in wanted:
        wanted[key] = eqn
    if not wanted:
      return
    workers = max(1, min(len(wanted), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      futures = {key: pool.submit(_lowered(eqn).compile) for key, eqn in wanted.items()}
      for key, future in futures.items():
        self._keep(key, future.result())

  def apply(self, eqn, values: Sequence) -> list:
    """The operation's results on `values` (every operand's value, a
    `Literal`'s included), compiled if no `prepare` did."""
    key = signature(eqn)
    if key is None:
      return jaxprs.bind(eqn, values)
    with self._lock:
      compiled = self._compiled.get(key)
      if compiled is not None:
        self._compiled.move_to_end(key)
    if compiled is None:
      compiled = _lowered(eqn).compile()
      self._keep(key, compiled)
    outs = compiled(*values)
    return list(outs) if eqn.primitive.multiple_results else [outs]

  def _keep(self, key: Hashable, compiled) -> None:
    with self._lock:
      self._compiled[key] = compiled
      while len(self._compiled) > self._capacity:
        self._compiled.popitem(last=False)


#: The process's compiled operations.
OPERATIONS = Operations()


def run_operation(eqn, operands: Sequence, read: Callable[[Any], Any]) -> list:
  """`eqn` applied to its operands (`read` gives the value of each; a `Literal` is its value)."""
  return OPERATIONS.apply(eqn, [o.value if isinstance(o, Literal) else read(o) for o in operands])
