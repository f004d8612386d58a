"""Running a traced program operation by operation, its variables made on demand.

`evaluate` runs a closed jaxpr (flattened once into a `Program`) one
operation at a time (each distinct one compiled once, all before the run
starts, on every core: `operations`), not the whole program, so a variable input is made when
first read and let go after its last use: the run holds the values in
flight, never every variable at once. Calls (jit, remat, custom
derivatives) are inlined first, so a call's operands are not all made
before its first operation; operations that only place a value (sharding
constraints, `device_put`) pass it through. A `scan` over a variable not
yet made runs one iteration at a time, making one layer of it at a time.

Run it outside any mesh (`jax.set_mesh(None)`): under one, every eager
operation is replicated to each of its devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from converters.inference.dataflow import WHOLE_ARRAY_CALLS
from converters.inference.operations import OPERATIONS, Literal, run_operation

#: Operations that only place a value: the run is on one device.
PLACING = frozenset({'sharding_constraint', 'mesh_cast', 'reshard', 'device_put'})

#: `variable(k, layer)`: input `k` (`layer` None), or its slice `layer`.
VariableSource = Callable[[int, 'int | None'], Any]


@dataclasses.dataclass
class Program:
  """A jaxpr flattened: `steps` of `(eqn, operands, results)` over numbered
  values, operands numbers or `Literal`s; calls inlined, placing aliased."""

  inputs: list[int]
  outputs: list[Any]
  steps: list[tuple]
  constants: dict[int, Any]
  size: int = 0
  scans: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def of(cls, closed) -> 'Program':
    program = cls([], [], [], {})
    names: dict = {}
    program.inputs = [program._new(names, v) for v in closed.jaxpr.invars]
    program._inline(closed.jaxpr, closed.consts, names)
    program.outputs = [program._atom(names, v) for v in closed.jaxpr.outvars]
    return program

  @functools.cached_property
  def last_use(self) -> dict[int, int]:
    """`{value: index of the last step that reads it}`."""
    last: dict[int, int] = {}
    for i, (_, operands, _) in enumerate(self.steps):
      for o in operands:
        if isinstance(o, int):
          last[o] = i
    return last

  def _new(self, names, var) -> int:
    self.size += 1
    names[var] = self.size
    return self.size

  @staticmethod
  def _atom(names, v):
    return Literal(v.val) if isinstance(v, jcore.Literal) else names[v]

  def _inline(self, jaxpr, consts, names) -> None:
    for var, value in zip(jaxpr.constvars, consts):
      self.constants[self._new(names, var)] = value
    for eqn in jaxpr.eqns:
      operands = [self._atom(names, v) for v in eqn.invars]
      name = eqn.primitive.name
      if name in PLACING:
        names.update(zip(eqn.outvars, operands))
        continue
      called = eqn.params.get(WHOLE_ARRAY_CALLS.get(name, ''))
      if called is not None:
        inner = called if isinstance(called, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(called, ())
        scope = dict(zip(inner.jaxpr.invars, operands[len(operands) - len(inner.jaxpr.invars):]))
        self._inline(inner.jaxpr, inner.consts, scope)
        names.update(zip(eqn.outvars, (self._atom(scope, v) for v in inner.jaxpr.outvars)))
        continue
      results = [self._new(names, v) for v in eqn.outvars]
      if name == 'scan':
        # A scanned or carried value the body returns as it is (an NNX
        # scan's state) is its operand: nothing to stack or hold.
        for j, k in _passed_through(eqn, self.body(eqn)).items():
          names[eqn.outvars[j]], results[j] = operands[k], None
      self.steps.append((eqn, operands, results))

  def operations(self, variables=frozenset()) -> Iterator:
    """The equation of each operation a run applies: a `scan` over one
    of `variables` (inputs made on demand) by those of its body, any other
    as a whole."""
    for eqn, operands, _ in self.steps:
      first = eqn.params['num_consts'] + eqn.params['num_carry'] if eqn.primitive.name == 'scan' else None
      if first is not None and any(isinstance(o, int) and o in variables for o in operands[first:]):
        yield from self.body(eqn).operations()
      else:
        yield eqn

  def body(self, eqn) -> 'Program':
    """The flattened body of a `scan` step (made once)."""
    if id(eqn) not in self.scans:
      self.scans[id(eqn)] = Program.of(eqn.params['jaxpr'])
    return self.scans[id(eqn)]


def _passed_through(eqn, body: Program) -> dict[int, int]:
  """`{result: operand}` of a scan's results that are an operand unchanged:
  a carry the body returns in its place, or a scanned operand it returns as
  one of its stacked results."""
  consts, carry = eqn.params['num_consts'], eqn.params['num_carry']
  found = {}
  for j, out in enumerate(body.outputs):
    if not isinstance(out, int) or out not in body.inputs:
      continue
    k = body.inputs.index(out)
    if (j < carry and k == consts + j) or (j >= carry and k >= consts + carry):
      found[j] = k
  return found


def evaluate(program: Program, n_variables: int, variable: VariableSource, inputs: Sequence,
             n_results: int = 0) -> list:
  """`program` (`Program.of(closed_jaxpr)`, made once for any number of
  runs) run operation by operation: input `k < n_variables` is
  `variable(k, None)`, made when first read (or one layer at a time,
  `variable(k, layer)`, by a scan over it) and let go after its last use.
  Outputs that are variables returned as they are come back as None, but
  the first `n_results` (the call's own results), which are always values.
  """
  pending = {r: k for k, r in enumerate(program.inputs[:n_variables])}
  OPERATIONS.prepare(program.operations(pending))
  values = dict(program.constants)
  values.update(zip(program.inputs[n_variables:], inputs))
  outputs = _run(program, values, pending, variable)
  return [
      None if k >= n_results and isinstance(o, int) and o in pending else _read(o, values, pending, variable)
      for k, o in enumerate(outputs)
  ]


def _run(program: Program, values: dict, pending: dict, variable: VariableSource) -> list:
  last = program.last_use
  keep = {o for o in program.outputs if isinstance(o, int) and o not in pending}
  for i, (eqn, operands, results) in enumerate(program.steps):
    if eqn.primitive.name == 'scan' and _lazy_operands(eqn, operands, values, pending):
      outs = _scan(program, eqn, operands, results, values=values, pending=pending, variable=variable)
    else:
      outs = run_operation(eqn, operands, lambda o: _read(o, values, pending, variable))
    values.update((r, out) for r, out in zip(results, outs) if r is not None)
    for o in operands:
      if isinstance(o, int) and last.get(o) == i and o not in keep:
        values.pop(o, None)
  return program.outputs


def _read(atom, values: dict, pending: dict, variable: VariableSource):
  if isinstance(atom, Literal):
    return atom.value
  if atom not in values:
    values[atom] = variable(pending[atom], None)
  return values[atom]


def _lazy_operands(eqn, operands, values, pending) -> bool:
  """A scan whose scanned operands include a variable not made yet."""
  first = eqn.params['num_consts'] + eqn.params['num_carry']
  return any(isinstance(o, int) and o in pending and o not in values for o in operands[first:])


def _scan(program: Program, eqn, operands, results, *, values, pending, variable) -> list:
  """A `scan` one iteration at a time; a scanned variable not made yet is
  made one layer at a time (and a result passed through, None, not stacked)."""
  p = eqn.params
  consts_n, carry_n, length = p['num_consts'], p['num_carry'], p['length']
  read = lambda o: _read(o, values, pending, variable)
  consts = [read(o) for o in operands[:consts_n]]
  carry = [read(o) for o in operands[consts_n:consts_n + carry_n]]
  scanned = operands[consts_n + carry_n:]
  body = program.body(eqn)
  ys: list[list] = []
  for t in range(length):
    layer = length - 1 - t if p['reverse'] else t
    xs = [
        variable(pending[o], layer) if isinstance(o, int) and o in pending and o not in values
        else read(o)[layer]
        for o in scanned
    ]
    inner = dict(body.constants)
    inner.update(zip(body.inputs, [*consts, *carry, *xs]))
    outs = [_read(o, inner, {}, variable) for o in _run(body, inner, {}, variable)]
    carry = outs[:carry_n]
    ys.append([None if r is None else y for r, y in zip(results[carry_n:], outs[carry_n:])])
  if p['reverse']:
    ys.reverse()
  stacked = [
      None if results[carry_n + j] is None
      else jnp.stack([y[j] for y in ys]) if length else jnp.zeros((0, *aval.shape), aval.dtype)
      for j, aval in enumerate(v.aval for v in p['jaxpr'].jaxpr.outvars[carry_n:])
  ]
  return [*carry, *stacked]


@contextlib.contextmanager
def outside_any_mesh():
  """The context to evaluate in: one device, no mesh."""
  with jax.set_mesh(None), jax.default_device(jax.local_devices()[0]):
    yield
