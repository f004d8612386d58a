"""What an equation of a traced program is, read once for inference's three
readers (`dataflow`'s graph, `evaluation`'s run, `unrolling`'s rewrite).

`structure(eqn)` tells by the primitive itself (never its name) whether an
equation calls a jaxpr on whole arrays (`jit`, `remat`, custom derivatives:
`Call`), runs one on shards (`ShardMap`), loops (`Scan`, `While`), branches
(`Cond`) or only places its operand (`Placing`: a sharding constraint,
`device_put`, `reshard`), with its jaxprs and operand counts unpacked; None
for any other operation. `interpret` runs a jaxpr over a reader's own
values, inlining the calls the reader inlines and handing every other
equation, with its structure, to the reader's rule for that structure (a
table, as jax2tf keeps one rule per primitive), else to its default rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from jax.extend import core as jcore
from jax.extend.core import primitives

from converters import compat

#: Primitives that call a jaxpr on whole arrays, and the parameter holding it.
_CALLS = {
    primitives.jit_p: 'jaxpr', primitives.remat_p: 'jaxpr', primitives.closed_call_p: 'call_jaxpr',
    primitives.call_p: 'call_jaxpr', primitives.custom_jvp_call_p: 'call_jaxpr',
    primitives.custom_vjp_call_p: 'call_jaxpr',
}
#: Primitives whose result is their operand, placed (the run is on one device).
_PLACING = frozenset({primitives.sharding_constraint_p, primitives.device_put_p, compat.RESHARD_P})


def _closed(jaxpr) -> jcore.ClosedJaxpr:
  return jaxpr if isinstance(jaxpr, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(jaxpr, ())


@dataclasses.dataclass(frozen=True)
class Call:
  """`jaxpr` run on whole arrays, on the equation's last operands."""

  jaxpr: jcore.ClosedJaxpr

  def operands(self, ins: Sequence) -> list:
    return list(ins[len(ins) - len(self.jaxpr.jaxpr.invars):])


@dataclasses.dataclass(frozen=True)
class ShardMap(Call):
  """`jaxpr` run on each device's shards under the mesh's axis names."""


def _cut(ins: Sequence, first: int, second: int) -> tuple[list, list, list]:
  """`ins` cut into its first `first`, the `second` after them, and the rest."""
  return list(ins[:first]), list(ins[first:first + second]), list(ins[first + second:])


@dataclasses.dataclass(frozen=True)
class Scan:
  """`body` run `length` times (from the end with `reverse`): its operands
  `n_consts` constants, `n_carry` carried values, then the sliced ones."""

  body: jcore.ClosedJaxpr
  length: int
  reverse: bool
  n_consts: int
  n_carry: int

  def split(self, ins: Sequence) -> tuple[list, list, list]:
    """`(consts, carry, xs)` of the equation's operands."""
    return _cut(ins, self.n_consts, self.n_carry)


@dataclasses.dataclass(frozen=True)
class While:
  """`body` run while `cond` holds: operands `n_cond_consts` constants of
  the condition, `n_body_consts` of the body, then the carried values."""

  cond: jcore.ClosedJaxpr
  body: jcore.ClosedJaxpr
  n_cond_consts: int
  n_body_consts: int

  def split(self, ins: Sequence) -> tuple[list, list, list]:
    """`(cond_consts, body_consts, init)` of the equation's operands."""
    return _cut(ins, self.n_cond_consts, self.n_body_consts)


@dataclasses.dataclass(frozen=True)
class Cond:
  """One of `branches`, chosen by the first operand, run on the rest."""

  branches: tuple[jcore.ClosedJaxpr, ...]

  def split(self, ins: Sequence) -> tuple[Any, list]:
    """`(index, operands)` of the equation's operands."""
    return ins[0], list(ins[1:])


@dataclasses.dataclass(frozen=True)
class Placing:
  """An operation whose result is its operand, placed on devices."""


Structure = Call | ShardMap | Scan | While | Cond | Placing


def structure(eqn) -> Structure | None:
  """What `eqn` is, by its primitive; None for an operation on values."""
  primitive, params = eqn.primitive, eqn.params
  if primitive in _CALLS:
    called = params.get(_CALLS[primitive])
    return Call(_closed(called)) if called is not None else None
  if primitive is primitives.scan_p:
    return Scan(params['jaxpr'], params['length'], params['reverse'], params['num_consts'], params['num_carry'])
  if primitive is primitives.while_p:
    return While(params['cond_jaxpr'], params['body_jaxpr'], params['cond_nconsts'], params['body_nconsts'])
  if primitive is primitives.cond_p:
    return Cond(tuple(params['branches']))
  if primitive is compat.SHARD_MAP_P:
    return ShardMap(_closed(params['jaxpr']))
  if primitive in _PLACING:
    return Placing()
  return None


#: `rule(eqn, its structure or None, its operands' values, the calls it is
#: inlined from, innermost first) -> its results' values`.
Rule = Callable[[Any, 'Structure | None', list, tuple], list]


def interpret(jaxpr: jcore.ClosedJaxpr, args: Sequence, default: Rule, *,
              rules: Mapping[type, Rule] = MappingProxyType({}), inline: tuple[type, ...] = (Call,),
              literal: Callable[[Any], Any] = lambda value: value,
              constant: Callable[[Any], Any] = lambda value: value, calls: tuple = (),
              enter: Callable[[Any, tuple], None] | None = None) -> list:
  """The values of `jaxpr`'s outputs for the values `args` of its inputs,
  a reader's own kind of value (a graph's node, a program's number, an
  array or a tracer): an equation whose structure is one of `inline`
  (`Call` alone by default: a `ShardMap`, a subclass, stays whole unless
  named) runs inlined, any other by the rule `rules` holds for its
  structure's type, else by `default`; a literal's value is
  `literal(value)`, a constant's `constant(value)`; `enter(eqn, calls)`,
  if given, is called before each equation's operands are read."""
  inner = jaxpr.jaxpr
  env: dict = {v: constant(c) for v, c in zip(inner.constvars, jaxpr.consts)}
  env.update(zip(inner.invars, args))

  def read(v):
    return literal(v.val) if isinstance(v, jcore.Literal) else env[v]

  for eqn in inner.eqns:
    kind = structure(eqn)
    if enter is not None:
      enter(eqn, calls)
    ins = [read(v) for v in eqn.invars]
    if type(kind) in inline:
      outs = interpret(kind.jaxpr, kind.operands(ins), default, rules=rules, inline=inline, literal=literal,
                       constant=constant, calls=(eqn, *calls), enter=enter)
    else:
      outs = rules.get(type(kind), default)(eqn, kind, ins, calls)
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in inner.outvars]


def bind(eqn, values: Sequence) -> list:
  """`eqn`'s primitive applied again to `values`, in the context it was
  traced in: its results, as a list."""
  with eqn.ctx.manager:
    outs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
  return list(outs) if eqn.primitive.multiple_results else [outs]


def nested(kind: Structure | None) -> tuple[jcore.ClosedJaxpr, ...]:
  """The jaxprs an equation of structure `kind` runs (a call's, a loop's
  bodies, a branch's); none for an operation on values."""
  if isinstance(kind, Call):
    return (kind.jaxpr,)
  if isinstance(kind, Scan):
    return (kind.body,)
  if isinstance(kind, While):
    return (kind.cond, kind.body)
  if isinstance(kind, Cond):
    return kind.branches
  return ()
