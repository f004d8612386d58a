"""A trace with its scans unrolled, made from the trace itself.

A model that scans beside a port that loops is paired layer by layer: each
layer of a stacked variable becomes a variable of its own. `unrolled(trace)`
writes the traced program again with every `scan` replaced by its
iterations (`length` copies of its body, each reading `xs[t]` as a `slice`
of axis 0, its stacked results a `stack` of theirs) and calls inlined, so
scans inside a `jit` or a `remat` unroll too, as do those in the branches
of a `cond` and the body of a `while` (written again with `lax.switch` and
`lax.while_loop`). A `shard_map`'s body computes on shards under its own
axis names and is kept as it is, scans and all. It reads the jaxpr, not
the model: tracing a Linen `nn.scan` again under `jax.disable_jit()` runs
its Python once per layer and costs more than the first trace did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jcore

from converters.inference import jaxprs
from converters.inference.traces import Trace


def unrolled(trace: Trace) -> Trace:
  """`trace` with every `scan` unrolled (a trace without one comes back as it is)."""
  if not _scans(trace.closed.jaxpr):
    return trace
  closed = trace.closed
  avals = [
      jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type, sharding=v.aval.sharding)
      for v in closed.jaxpr.invars
  ]
  flat = jax.make_jaxpr(lambda *args: _evaluate(closed, args))(*avals)
  return dataclasses.replace(trace, closed=flat)


def _scans(jaxpr: jcore.Jaxpr) -> bool:
  """Whether `jaxpr` runs a `scan` that `unrolled` unrolls: in it, or in a
  call, branch or loop body of it (not in a `shard_map`)."""
  for eqn in jaxpr.eqns:
    kind = jaxprs.structure(eqn)
    if isinstance(kind, jaxprs.Scan):
      return True
    if not isinstance(kind, jaxprs.ShardMap) and any(_scans(inner.jaxpr) for inner in jaxprs.nested(kind)):
      return True
  return False


def _evaluate(closed: jcore.ClosedJaxpr, args: Sequence) -> list:
  return jaxprs.interpret(closed, args, _bound, rules=_UNROLLING)


def _bound(eqn, kind, ins: list, calls) -> list:
  """One equation as it was, bound again."""
  return jaxprs.bind(eqn, ins)


def _scan(eqn, scan: jaxprs.Scan, ins: list, calls) -> list:
  consts, carry, xs = scan.split(ins)
  ys: list = [None] * scan.length
  for t in (reversed(range(scan.length)) if scan.reverse else range(scan.length)):
    layer = [lax.index_in_dim(x, t, keepdims=False) for x in xs]  # a `slice` of axis 0
    outs = _evaluate(scan.body, [*consts, *carry, *layer])
    carry, ys[t] = outs[:scan.n_carry], outs[scan.n_carry:]
  stacked = [
      jnp.stack([y[j] for y in ys]) if scan.length else jnp.zeros((0, *v.aval.shape), v.aval.dtype)
      for j, v in enumerate(scan.body.jaxpr.outvars[scan.n_carry:])
  ]
  return [*carry, *stacked]


def _cond(eqn, cond: jaxprs.Cond, ins: list, calls) -> list:
  """A `cond` whose branches scan, with them unrolled (its index is
  already clamped to the branches: `switch` clamps it again, a no-op)."""
  if not any(_scans(b.jaxpr) for b in cond.branches):
    return _bound(eqn, cond, ins, calls)
  index, operands = cond.split(ins)
  branches = [lambda *operands, b=b: _evaluate(b, operands) for b in cond.branches]
  return list(lax.switch(index, branches, *operands))


def _while(eqn, loop: jaxprs.While, ins: list, calls) -> list:
  """A `while` whose condition or body scans, with them unrolled."""
  if not (_scans(loop.cond.jaxpr) or _scans(loop.body.jaxpr)):
    return _bound(eqn, loop, ins, calls)
  cond_consts, body_consts, init = loop.split(ins)
  out = lax.while_loop(
      lambda carry: _evaluate(loop.cond, [*cond_consts, *carry])[0],
      lambda carry: tuple(_evaluate(loop.body, [*body_consts, *carry])),
      tuple(init),
  )
  return list(out)


#: The rules that unroll: every other equation is bound as it was.
_UNROLLING = {jaxprs.Scan: _scan, jaxprs.Cond: _cond, jaxprs.While: _while}
