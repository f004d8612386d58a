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

from converters.inference import jaxprs
from converters.inference.operations import OPERATIONS, Literal, run_operation

#: `variable(k, layer)`: input `k` (`layer` None), or its slice `layer`.
VariableSource = Callable[[int, 'int | None'], Any]


@dataclasses.dataclass(frozen=True)
class Step:
  """One operation of a `Program`: the equation, what it is (`jaxprs.structure`),
  its operands (numbers or `Literal`s) and the numbers of its results (None
  for a scan's result that is one of its operands, passed through)."""

  eqn: Any
  kind: jaxprs.Structure | None
  operands: list
  results: list


@dataclasses.dataclass
class Program:
  """A jaxpr flattened: `steps` over numbered values; calls inlined,
  placing aliased."""

  inputs: list[int]
  outputs: list[Any]
  steps: list[Step]
  constants: dict[int, Any]
  size: int = 0
  scans: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def of(cls, closed) -> 'Program':
    program = cls([], [], [], {})
    program.inputs = [program._number() for _ in closed.jaxpr.invars]
    program.outputs = jaxprs.interpret(
        closed, program.inputs, program._step, literal=Literal, constant=program._constant,
        rules={jaxprs.Placing: _placed, jaxprs.Scan: program._scan_step})
    return program

  @functools.cached_property
  def last_use(self) -> dict[int, int]:
    """`{value: index of the last step that reads it}`."""
    last: dict[int, int] = {}
    for i, step in enumerate(self.steps):
      for o in step.operands:
        if isinstance(o, int):
          last[o] = i
    return last

  def _number(self) -> int:
    self.size += 1
    return self.size

  def _constant(self, value) -> int:
    n = self._number()
    self.constants[n] = value
    return n

  def _step(self, eqn, kind, operands: list, calls) -> list:
    """The values of `eqn`'s results, its step appended."""
    return self._append(eqn, kind, operands, {})

  def _scan_step(self, eqn, scan: jaxprs.Scan, operands: list, calls) -> list:
    """A scan's step: a scanned or carried value its body returns as it is
    (an NNX scan's state) is its operand, nothing to stack or hold."""
    return self._append(eqn, scan, operands, _passed_through(scan, self.body(scan)))

  def _append(self, eqn, kind, operands: list, passed: dict[int, int]) -> list:
    """`eqn`'s step appended: its results numbered, but those `passed`
    through (`{result: operand}`), which are their operands (result None)."""
    numbers = [self._number() for _ in eqn.outvars]
    self.steps.append(Step(eqn, kind, operands, [None if j in passed else n for j, n in enumerate(numbers)]))
    return [operands[passed[j]] if j in passed else n for j, n in enumerate(numbers)]

  def operations(self, variables=frozenset()) -> Iterator:
    """The equation of each operation a run applies: a `scan` over one
    of `variables` (inputs made on demand) by those of its body, any other
    as a whole."""
    for step in self.steps:
      if isinstance(step.kind, jaxprs.Scan) and _scans_over(step, variables):
        yield from self.body(step.kind).operations()
      else:
        yield step.eqn

  def body(self, scan: jaxprs.Scan) -> 'Program':
    """The flattened body of a `scan` (made once)."""
    if id(scan.body) not in self.scans:
      self.scans[id(scan.body)] = Program.of(scan.body)
    return self.scans[id(scan.body)]


def _placed(eqn, kind, operands: list, calls) -> list:
  """An operation that only places its operands: they are its results."""
  return operands[:len(eqn.outvars)]


def _scans_over(step: Step, values) -> bool:
  """Whether the scan `step` slices one of `values`."""
  _, _, xs = step.kind.split(step.operands)
  return any(isinstance(o, int) and o in values for o in xs)


def _passed_through(scan: jaxprs.Scan, body: Program) -> dict[int, int]:
  """`{result: operand}` of a scan's results that are an operand unchanged:
  a carry the body returns in its place, or a scanned operand it returns as
  one of its stacked results."""
  consts, carry = scan.n_consts, scan.n_carry
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
  for i, step in enumerate(program.steps):
    if isinstance(step.kind, jaxprs.Scan) and _lazy_operands(step, values, pending):
      outs = _scan(program, step, values=values, pending=pending, variable=variable)
    else:
      outs = run_operation(step.eqn, step.operands, lambda o: _read(o, values, pending, variable))
    values.update((r, out) for r, out in zip(step.results, outs) if r is not None)
    for o in step.operands:
      if isinstance(o, int) and last.get(o) == i and o not in keep:
        values.pop(o, None)
  return program.outputs


def _read(atom, values: dict, pending: dict, variable: VariableSource):
  if isinstance(atom, Literal):
    return atom.value
  if atom not in values:
    values[atom] = variable(pending[atom], None)
  return values[atom]


def _lazy_operands(step: Step, values, pending) -> bool:
  """A scan whose scanned operands include a variable not made yet."""
  _, _, xs = step.kind.split(step.operands)
  return any(isinstance(o, int) and o in pending and o not in values for o in xs)


def _scan(program: Program, step: Step, *, values, pending, variable) -> list:
  """A `scan` one iteration at a time; a scanned variable not made yet is
  made one layer at a time (and a result passed through, None, not stacked)."""
  scan: jaxprs.Scan = step.kind
  read = lambda o: _read(o, values, pending, variable)
  consts_in, carry_in, scanned = scan.split(step.operands)
  consts, carry = [read(o) for o in consts_in], [read(o) for o in carry_in]
  body = program.body(scan)
  ys: list[list] = []
  for t in range(scan.length):
    layer = scan.length - 1 - t if scan.reverse else t
    xs = [
        variable(pending[o], layer) if isinstance(o, int) and o in pending and o not in values
        else read(o)[layer]
        for o in scanned
    ]
    inner = dict(body.constants)
    inner.update(zip(body.inputs, [*consts, *carry, *xs]))
    outs = [_read(o, inner, {}, variable) for o in _run(body, inner, {}, variable)]
    carry = outs[:scan.n_carry]
    ys.append([None if r is None else y for r, y in zip(step.results[scan.n_carry:], outs[scan.n_carry:])])
  if scan.reverse:
    ys.reverse()
  stacked = [
      None if step.results[scan.n_carry + j] is None
      else jnp.stack([y[j] for y in ys]) if scan.length else jnp.zeros((0, *aval.shape), aval.dtype)
      for j, aval in enumerate(v.aval for v in scan.body.jaxpr.outvars[scan.n_carry:])
  ]
  return [*carry, *stacked]


@contextlib.contextmanager
def outside_any_mesh():
  """The context to evaluate in: one device, no mesh."""
  with jax.set_mesh(None), jax.default_device(jax.local_devices()[0]):
    yield
