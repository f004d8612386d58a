"""`converters.port.factories`: the partials, lifted transforms, fields and
handed classes a method makes modules through."""

from __future__ import annotations

import functools
from functools import partial

import jax
import jax.numpy as jnp
import libcst as cst
import pytest
from flax import linen as nn

from converters.port import factories, source, syntax, tracing


class Inner(nn.Module):
  dense: type = nn.Dense

  @nn.compact
  def __call__(self, x):
    return self.dense(3)(x)


class Outer(nn.Module):
  norm_cls: type = nn.LayerNorm

  @nn.compact
  def __call__(self, x):
    norm = partial(nn.BatchNorm, use_running_average=True, momentum=0.9)
    bias_free = functools.partial(nn.Dense, use_bias=False)
    handed = partial(nn.Dense, use_bias=False)  # handed on, never called here
    x = norm()(x)
    x = bias_free(4)(x)
    x = self.norm_cls()(x)
    x = Inner(dense=partial(nn.Dense, use_bias=False))(x)
    return Inner(dense=nn.Dense)(x) + Inner(dense=handed)(x)


def _read(keeps_handed_on: bool):
  root, _ = tracing.trace(Outer(), jax.ShapeDtypeStruct((2, 3), jnp.float32))
  file = source.file_of(Outer)
  method = next(s for s in file.class_def(Outer).body.body if isinstance(s, cst.FunctionDef))
  sites = {}
  for child in root.children:
    sites.setdefault(child.site, (file.call_at(child.site), []))[1].append(child)
  callees = factories.Callees(file, root.module, ('norm_cls',), syntax.assigned_once(method.body))

  def fail(node, message):
    raise AssertionError(message)

  return factories.read(sites, callees, keeps_handed_on, fail), callees, sites, file


def test_partials_bound_to_locals_are_factories_and_handed_on_ones_where_kept():
  found, _, _, file = _read(keeps_handed_on=False)
  assert sorted(found.partials) == ['bias_free', 'norm']
  assert file.code(found.partials['norm'].args[0].value) == 'nn.BatchNorm'
  assert not found.lifts and not found.lift_calls
  found, _, _, _ = _read(keeps_handed_on=True)
  assert sorted(found.partials) == ['bias_free', 'handed', 'norm']


def test_a_callee_names_the_traced_field_the_local_partial_or_the_files_class():
  _, callees, _, _ = _read(keeps_handed_on=False)
  assert callees.target(syntax.expression('self.norm_cls')) is nn.LayerNorm
  assert callees.target(syntax.expression('nn.Dense')) is nn.Dense
  through_local = callees.target(syntax.expression('norm'))
  assert factories.factory_class(through_local) is nn.BatchNorm
  assert factories.factory_class(partial(partial(nn.Conv, 3), use_bias=False)) is nn.Conv
  assert factories.factory_class(jax.nn.relu) is None


def test_flax_classes_handed_to_a_users_block_as_they_are_or_as_a_partial():
  _, _, sites, file = _read(keeps_handed_on=False)
  handed = factories.handed_classes(sites, file)
  # (`handed`, a local, is not Linen's name: a kept factory, not handed.)
  assert sorted(file.code(v) for v in handed.values()) == ['nn.Dense', 'partial(nn.Dense, use_bias=False)']


@pytest.mark.parametrize('code, expected', [
    ('partial(nn.Dense, use_bias=False)', True),
    ('functools.partial(nn.Dense)', True),
    ('partial(*parts)', False),
    ('partial(func=nn.Dense)', False),
    ('nn.Dense(3)', False),
])
def test_what_is_a_partial_of_something(code, expected):
  file = source.file_of(Outer)
  assert factories.is_partial_of(syntax.expression(code), file) is expected
