"""A trace with its scans unrolled, made from the trace itself.

A model that scans beside a port that loops is paired layer by layer: each
layer of a stacked variable becomes a variable of its own. `unrolled(trace)`
writes the traced program again with every `scan` replaced by its
iterations (`length` copies of its body, each reading `xs[t]` as a `slice`
of axis 0, its stacked results a `concatenate` of theirs) and calls inlined,
so scans inside a `jit` or a `remat` unroll too. It reads the jaxpr, not the
model: tracing a Linen `nn.scan` again under `jax.disable_jit()` runs its
Python once per layer and costs more than the first trace did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jcore

from converters.inference.dataflow import CALLS
from converters.inference.tracing import Trace

#: Calls inlined; `shard_map`'s body computes on shards, so it is bound as it is.
_INLINED = {name: param for name, param in CALLS.items() if name != 'shard_map'}


def unrolled(trace: Trace) -> Trace:
  """`trace` with every `scan` unrolled (a trace without one comes back as it is)."""
  if not _scans(trace.closed.jaxpr):
    return trace
  closed = trace.closed
  avals = [
      jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
      for v in closed.jaxpr.invars
  ]
  flat = jax.make_jaxpr(lambda *args: _evaluate(closed.jaxpr, closed.consts, args))(*avals)
  return dataclasses.replace(trace, closed=flat)


def _scans(jaxpr: jcore.Jaxpr) -> bool:
  """Whether `jaxpr` runs a `scan`, in it or in a call it makes."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'scan':
      return True
    called = eqn.params.get(_INLINED.get(eqn.primitive.name, ''))
    if called is not None and _scans(getattr(called, 'jaxpr', called)):
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
    called = eqn.params.get(_INLINED.get(name, ''))
    if name == 'scan':
      outs = _scan(eqn.params, ins)
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
