"""`converters.port.syntax`: the rewrites the writers share."""

from __future__ import annotations

import libcst as cst

from converters.port import syntax


def _method(code: str) -> cst.FunctionDef:
  return cst.parse_statement(code)


def test_an_unread_local_computed_by_pure_builtins_goes_and_one_calling_anything_else_stays():
  method = _method(
      'def f(self, x):\n'
      '  width = int(64 * self.factor)\n'
      '  n = len(x.shape)\n'
      '  y = self.draw(x)\n'
      '  return x\n'
  )
  kept = cst.Module([]).code_for_node(syntax.without_unused_locals(method))
  assert 'width' not in kept and 'n = ' not in kept
  assert 'y = self.draw(x)' in kept  # a call may have an effect


def test_a_local_read_later_stays():
  method = _method('def f(self, x):\n  width = int(64 * self.factor)\n  return x * width\n')
  assert 'width = int' in cst.Module([]).code_for_node(syntax.without_unused_locals(method))


def test_names_in_reads_values_not_attribute_names_nor_keywords():
  node = syntax.expression('f(a.b, k=v, *rest)[i] + self.c')
  assert syntax.names_in(node) == {'f', 'a', 'v', 'rest', 'i', 'self'}


def test_a_visitor_of_name_loads_sees_each_load_once_in_order():
  seen = []

  class Loads(syntax.NameLoads):
    def visit_Name(self, node):
      seen.append(node.value)

  syntax.expression('g(x.y, key=x, x=z)').visit(Loads())
  assert seen == ['g', 'x', 'x', 'z']


def test_self_attribute_is_the_name_read_off_self_only():
  assert syntax.self_attribute(syntax.expression('self.dense')) == 'dense'
  for other in ('self', 'other.dense', 'self.a.b', 'dense', 'self[0]'):
    assert syntax.self_attribute(syntax.expression(other)) is None, other
  assert syntax.is_self(syntax.expression('self')) and not syntax.is_self(syntax.expression('this'))


def test_calls_in_sees_a_call_anywhere_and_only_a_call():
  assert syntax.calls_in(syntax.expression('a + [b, normal(stddev=0.1)]'))
  assert not syntax.calls_in(syntax.expression('a.b[c] * (d, e)'))


def test_names_bound_by_reads_the_kinds_asked_for_only():
  body = cst.parse_module('for i, (j, k) in x:\n  a = b = i\n  c.d = 1\nwith f() as g:\n  pass\n').body
  assert syntax.names_bound_by(body, (cst.For,)) == {'i', 'j', 'k'}
  assert syntax.names_bound_by(body, (cst.AssignTarget,)) == {'a', 'b'}
