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

from converters.inference.dataflow import WHOLE_ARRAY_CALLS
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
  flat = jax.make_jaxpr(lambda *args: _evaluate(closed.jaxpr, closed.consts, args))(*avals)
  return dataclasses.replace(trace, closed=flat)


def _scans(jaxpr: jcore.Jaxpr) -> bool:
  """Whether `jaxpr` runs a `scan` that `unrolled` unrolls: in it, or in a
  call, branch or loop body of it (not in a `shard_map`)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'scan':
      return True
    if eqn.primitive.name != 'shard_map' and any(
        _scans(getattr(inner, 'jaxpr', inner)) for inner in jcore.jaxprs_in_params(eqn.params)
    ):
      return True
  return False


def _evaluate(jaxpr: jcore.Jaxpr, consts: Sequence, args: Sequence) -> list:
  env: dict = {}

  def read(v):
    return v.val if isinstance(v, jcore.Literal) else env[v]

  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    called = eqn.params.get(WHOLE_ARRAY_CALLS.get(name, ''))
    if name == 'scan':
      outs = _scan(eqn.params, ins)
    elif name == 'cond' and any(_scans(b.jaxpr) for b in eqn.params['branches']):
      outs = _cond(eqn.params, ins)
    elif name == 'while' and (
        _scans(eqn.params['cond_jaxpr'].jaxpr) or _scans(eqn.params['body_jaxpr'].jaxpr)):
      outs = _while(eqn.params, ins)
    elif called is not None:
      inner, inner_consts = (called.jaxpr, called.consts) if isinstance(called, jcore.ClosedJaxpr) else (called, ())
      outs = _evaluate(inner, inner_consts, ins[len(ins) - len(inner.invars):])
    else:
      with eqn.ctx.manager:
        outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
      outs = list(outs) if eqn.primitive.multiple_results else [outs]
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def _scan(params, ins: list) -> list:
  n_consts, n_carry, length = params['num_consts'], params['num_carry'], params['length']
  body = params['jaxpr']
  consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
  ys: list = [None] * length
  for t in (reversed(range(length)) if params['reverse'] else range(length)):
    layer = [lax.index_in_dim(x, t, keepdims=False) for x in xs]  # a `slice` of axis 0
    outs = _evaluate(body.jaxpr, body.consts, [*consts, *carry, *layer])
    carry, ys[t] = outs[:n_carry], outs[n_carry:]
  stacked = [
      jnp.stack([y[j] for y in ys]) if length else jnp.zeros((0, *v.aval.shape), v.aval.dtype)
      for j, v in enumerate(body.jaxpr.outvars[n_carry:])
  ]
  return [*carry, *stacked]


def _cond(params, ins: list) -> list:
  """A `cond` whose branches scan, with them unrolled (its index is
  already clamped to the branches: `switch` clamps it again, a no-op)."""
  branches = [
      lambda *operands, b=b: _evaluate(b.jaxpr, b.consts, operands) for b in params['branches']
  ]
  return list(lax.switch(ins[0], branches, *ins[1:]))


def _while(params, ins: list) -> list:
  """A `while` whose condition or body scans, with them unrolled."""
  cond, body = params['cond_jaxpr'], params['body_jaxpr']
  n_cond, n_body = params['cond_nconsts'], params['body_nconsts']
  cond_consts, body_consts, init = ins[:n_cond], ins[n_cond:n_cond + n_body], ins[n_cond + n_body:]
  out = lax.while_loop(
      lambda carry: _evaluate(cond.jaxpr, cond.consts, [*cond_consts, *carry])[0],
      lambda carry: tuple(_evaluate(body.jaxpr, body.consts, [*body_consts, *carry])),
      tuple(init),
  )
  return list(out)
