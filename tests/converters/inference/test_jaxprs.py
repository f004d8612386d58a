"""`converters.inference.jaxprs`: what an equation is, and one interpreter inlining calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.extend import core as jcore
from jax.sharding import PartitionSpec as P

from converters.inference import jaxprs


def _equations(f, *args):
  return jax.make_jaxpr(f)(*args).jaxpr.eqns


@jax.custom_jvp
def _jvp_sin(x):
  return jnp.sin(x)


_jvp_sin.defjvp(lambda primals, tangents: (_jvp_sin(primals[0]), jnp.cos(primals[0]) * tangents[0]))


@jax.custom_vjp
def _vjp_double(x):
  return 2 * x


_vjp_double.defvjp(lambda x: (2 * x, None), lambda _, g: (2 * g,))


@pytest.mark.parametrize('f', [
    jax.jit(lambda x: x + 1), jax.checkpoint(lambda x: x * 3), _jvp_sin, _vjp_double,
], ids=['jit', 'remat', 'custom_jvp', 'custom_vjp'])
def test_a_call_on_whole_arrays_is_a_call_of_its_jaxpr(f):
  (eqn,) = _equations(f, jnp.ones(3))
  kind = jaxprs.structure(eqn)
  assert type(kind) is jaxprs.Call and isinstance(kind.jaxpr, jcore.ClosedJaxpr)
  assert kind.operands(['a', 'b', 'x'])[-len(kind.jaxpr.jaxpr.invars):] == ['x']


def test_loops_and_branches_are_read_with_their_operands_split():
  def f(c, xs):
    c, ys = lax.scan(lambda c, x: (c + x * 2.0, c), c, xs, reverse=True)
    c = lax.while_loop(lambda c: c < 10.0, lambda c: c + ys[0], c)
    return lax.cond(c > 0, lambda a: a, lambda a: -a, c)

  scan, loop, *_, cond = _equations(f, 0.0, jnp.ones(4))
  kind = jaxprs.structure(scan)
  assert type(kind) is jaxprs.Scan and (kind.length, kind.reverse, kind.n_carry) == (4, True, 1)
  consts, carry, xs = kind.split(['k'] * kind.n_consts + ['c', 'x'])
  assert (carry, xs) == (['c'], ['x']) and len(consts) == kind.n_consts
  kind = jaxprs.structure(loop)
  assert type(kind) is jaxprs.While
  assert kind.split(list(range(kind.n_cond_consts + kind.n_body_consts + 1)))[2] == [
      kind.n_cond_consts + kind.n_body_consts]
  kind = jaxprs.structure(cond)
  assert type(kind) is jaxprs.Cond and len(kind.branches) == 2
  assert kind.split(['i', 'a']) == ('i', ['a'])
  assert len(jaxprs.nested(kind)) == 2 and jaxprs.nested(None) == ()


def test_placements_and_shard_maps_are_told_by_their_primitive():
  explicit = jax.make_mesh((8,), ('x',), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(explicit):
    resharded = _equations(
        lambda a: jax.shard_map(lambda b: b * 2, out_specs=P('x'))(jax.sharding.reshard(a, P('x'))), jnp.ones(8))
  auto = jax.make_mesh((8,), ('x',), axis_types=(jax.sharding.AxisType.Auto,))
  with jax.set_mesh(auto):
    constrained = _equations(lambda a: jax.lax.with_sharding_constraint(a, P('x')), jnp.ones(8))
  put = _equations(lambda a: jax.device_put(a, jax.devices()[0]), jnp.ones(2))
  kinds = [type(jaxprs.structure(e)) for e in [*resharded, *constrained, *put]]
  assert kinds == [jaxprs.Placing, jaxprs.ShardMap, jaxprs.Placing, jaxprs.Placing]
  assert jaxprs.structure(_equations(lambda a: a + 1, 1.0)[0]) is None


def test_a_primitive_of_a_control_flow_name_is_not_taken_for_it():
  impostor = jcore.Primitive('scan')
  impostor.def_abstract_eval(lambda x: x)
  (eqn,) = _equations(lambda x: impostor.bind(x), 1.0)
  assert eqn.primitive.name == 'scan' and jaxprs.structure(eqn) is None


def test_interpret_inlines_calls_within_calls_and_hands_on_the_rest_with_the_calls_they_are_in():
  inner = jax.jit(lambda a: a * 2.0)
  closed = jax.make_jaxpr(lambda x: jax.checkpoint(lambda a: inner(a) + 1.0)(x) - 3.0)(1.0)
  seen = []

  def rule(eqn, kind, ins, calls):
    seen.append((eqn.primitive.name, [c.primitive.name for c in calls], ins))
    return [f'{eqn.primitive.name}({",".join(map(str, ins))})']

  (out,) = jaxprs.interpret(closed, ['x'], rule, literal=lambda v: f'lit{float(v):g}')
  assert [(name, calls) for name, calls, _ in seen] == [('mul', ['jit', 'remat2']), ('add', ['remat2']),
                                                       ('sub', [])]
  assert out == 'sub(add(mul(x,lit2),lit1),lit3)'


def test_interpret_keeps_a_shard_map_whole_unless_asked_and_reads_constants_through_its_hook():
  mesh = jax.make_mesh((8,), ('x',), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh):
    closed = jax.make_jaxpr(lambda a: jax.shard_map(lambda b: b * 2.0, out_specs=P('x'))(a))(jnp.ones(8))
  names = lambda **options: [e.primitive.name for e in _ran(closed, **options)]
  assert names() == ['shard_map']
  inlined = names(inline=(jaxprs.Call, jaxprs.ShardMap))
  assert 'mul' in inlined and 'shard_map' not in inlined
  table = jnp.arange(3.0)
  closed = jax.make_jaxpr(lambda x: x + table)(jnp.ones(3))
  constants = []
  jaxprs.interpret(closed, ['x'], lambda eqn, kind, ins, calls: ['y'],
                   constant=lambda value: constants.append(value) or 'c')
  assert closed.consts and len(constants) == len(closed.consts)


def _ran(closed, **options) -> list:
  ran = []
  jaxprs.interpret(closed, ['a'], lambda eqn, kind, ins, calls: ran.append(eqn) or ['out'] * len(eqn.outvars),
                   **options)
  return ran


def test_interpret_hands_each_structure_to_its_rule_and_the_rest_to_the_default():
  closed = jax.make_jaxpr(lambda c, xs: lax.scan(lambda c, x: (c + x, c), c, xs)[0] * 2.0)(0.0, jnp.ones(3))
  ran = []
  rules = {jaxprs.Scan: lambda eqn, kind, ins, calls: ran.append(('scan', kind.length)) or ['s'] * len(eqn.outvars)}
  out = jaxprs.interpret(closed, ['c', 'xs'], lambda eqn, kind, ins, calls: ran.append(eqn.primitive.name) or [
      f'{eqn.primitive.name}({ins[0]}, {float(ins[1]):g})'], rules=rules)
  assert ran == [('scan', 3), 'mul'] and out == ['mul(s, 2)']


def test_operand_counts_are_each_loops_own():
  w, v = jnp.ones(()), jnp.full((), 2.0)

  def f(c, xs):
    c = lax.scan(lambda c, x: (c * w + x, None), c, xs)[0]  # one constant of the body
    return lax.while_loop(lambda c: c < w, lambda c: c + w * v, c)  # one of the condition, two of the body

  scan, loop = [e for e in _equations(f, 0.0, jnp.ones(3)) if jaxprs.structure(e) is not None]
  kind = jaxprs.structure(scan)
  assert (kind.n_consts, kind.n_carry) == (1, 1) and kind.split(['w', 'c', 'x']) == (['w'], ['c'], ['x'])
  kind = jaxprs.structure(loop)
  assert (kind.n_cond_consts, kind.n_body_consts) == (1, 2)
  assert kind.split(['a', 'b', 'c', 'init']) == (['a'], ['b', 'c'], ['init'])
  assert jaxprs.nested(kind) == (kind.cond, kind.body)  # a scan in the condition is found too
