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
