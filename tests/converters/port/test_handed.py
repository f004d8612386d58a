"""`converters.port.handed`: functions of the file handed the module, their
parameters read with the call's arguments, under the tests that lead to
them, and the function written to read the attributes NNX made."""

from __future__ import annotations

import textwrap
import types

import libcst as cst
import pytest

from converters.port import handed, source

_FUNCTIONS = '''
import jax.numpy as jnp
from flax import linen as nn


def get_posemb(self, typ, seqshape, width, name, dtype=jnp.float32):
  if typ == 'learn':
    return self.param(name, nn.initializers.normal(stddev=1 / width), (1, seqshape[0] * seqshape[1], width), dtype)
  elif typ == 'fixed':
    return jnp.zeros((1, seqshape[0] * seqshape[1], width), dtype)
  elif typ == 'both':
    return self.param('extra', nn.initializers.zeros, (1, 1, width))
  raise ValueError(typ)


def always(module, x):
  return x * module.param('scale', nn.initializers.ones, (x.shape[-1],))


def draws(module, x):
  return x + jax.random.normal(module.make_rng('noise'), x.shape)


def reads(module, x):
  return x * module.width


def in_a_loop(module, x):
  for i in range(2):
    x = x * module.param(f'scale{i}', nn.initializers.ones, (x.shape[-1],))
  return x


def after_return(module, x, skip):
  if skip:
    return x
  return x * module.param('scale', nn.initializers.ones, (x.shape[-1],))


def from_locals(module, x):
  width = x.shape[-1] * 2
  return module.param('scale', nn.initializers.ones, (width,))


def handed_on(module, x):
  return always(module, x)


def rebinds(module, typ, width):
  typ = typ.lower()
  if typ == 'learn':
    return module.param('pos', nn.initializers.zeros, (width,))
  return 0.0


def matched(module, x, n):
  match n:
    case 0:
      return x
    case _:
      return x * module.param('prefix', nn.initializers.ones, (n,))


def positional_only(module, /, typ, width):
  if typ == 'learn':
    return module.param('pos', nn.initializers.zeros, (width,))
  return 0.0
'''


def _file(tmp_path) -> source.SourceFile:
  path = tmp_path / 'functions.py'
  path.write_text(_FUNCTIONS)
  return source.SourceFile(str(path), types.ModuleType('functions'))


def _calls(file, code: str) -> list[handed.HandedCall]:
  return handed.handed_calls(file, cst.parse_module(textwrap.dedent(code)))


def _code(node) -> str:
  return cst.Module([]).code_for_node(node)


def test_each_parameter_is_read_with_the_calls_arguments_under_its_tests(tmp_path):
  (call,) = _calls(_file(tmp_path), "y = get_posemb(self, self.posemb, (h, w), c + 1, name='pos', dtype=x.dtype)\n")
  assert call.held == 'self' and call.function.name.value == 'get_posemb'
  learn, both = call.made
  assert _code(learn.call) == (
      "self.param('pos', nn.initializers.normal(stddev=1 / (c + 1)), (1, (h, w)[0] * (h, w)[1], (c + 1)), x.dtype)")
  assert _code(learn.test) == "self.posemb == 'learn'"
  # After an `if` and an `elif` not taken: both turned round, outermost first.
  assert _code(both.test) == "self.posemb != 'learn' and self.posemb != 'fixed' and self.posemb == 'both'"
  assert _code(both.call) == "self.param('extra', nn.initializers.zeros, (1, 1, (c + 1)))"


def test_a_default_the_call_leaves_is_the_functions(tmp_path):
  (call,) = _calls(_file(tmp_path), "y = get_posemb(self, 'learn', (2, 2), 4, 'pos')\n")
  assert _code(call.made[0].call).endswith(', jnp.float32)')


def test_a_parameter_made_always_has_no_test_and_a_module_held_by_another_name(tmp_path):
  (call,) = _calls(_file(tmp_path), 'y = always(self, y)\n')
  (made,) = call.made
  assert call.held == 'module' and made.test is None
  assert _code(made.call) == "self.param('scale', nn.initializers.ones, (y.shape[-1],))"


def test_the_function_for_nnx_reads_the_attributes_made():
  file_module = cst.parse_module(_FUNCTIONS)
  functions = {s.name.value: s for s in file_module.body if isinstance(s, cst.FunctionDef)}
  posemb = _code(handed.nnx_function(functions['get_posemb'], 'self'))
  assert 'return getattr(self, name)[...]' in posemb and 'return self.extra[...]' in posemb
  assert 'return jnp.zeros(' in posemb  # the other branches as they were
  assert 'return x * module.scale[...]' in _code(handed.nnx_function(functions['always'], 'module'))


def test_the_module_is_found_among_positional_only_parameters(tmp_path):
  with pytest.raises(handed.Refused, match='positional-only parameters'):
    _calls(_file(tmp_path), "y = positional_only(self, 'learn', 4)\n")


def test_a_call_handing_nothing_that_makes_variables_is_not_one(tmp_path):
  assert _calls(_file(tmp_path), 'y = always(x, y)\nz = get_posemb\n') == []


@pytest.mark.parametrize('call, message', [
    ('draws(self, x)', r'calls module\.make_rng\(\.\.\.\) in it'),
    ('reads(self, x)', r'reads module in it otherwise than by module\.param'),
    ('in_a_loop(self, x)', r'inside a for \(line'),
    ('after_return(self, x, True)', r'after a return or raise'),
    ('from_locals(self, x)', r'from what it computes itself \(width\)'),
    # A parameter bound again is not the call's argument: `typ.lower()` is
    # what the test reads, not `self.posemb`.
    ('rebinds(self, self.posemb, 4)', r'from what it computes itself \(typ\)'),
    ('matched(self, x, self.n)', r'inside a match'),
    ('handed_on(self, x)', r'reads module in it otherwise'),
    ('always(*args)', None),
])
def test_what_the_port_does_not_write_is_refused_saying_so(tmp_path, call, message):
  file = _file(tmp_path)
  if message is None:  # the module not seen handed: nothing to write
    assert _calls(file, f'y = {call}\n') == []
    return
  with pytest.raises(handed.Refused, match=message):
    _calls(file, f'y = {call}\n')


def test_a_test_the_calls_literals_decide_is_folded(tmp_path):
  # 'learn' == 'learn' always holds: no test; 'fixed' makes neither table.
  (learn,) = _calls(_file(tmp_path), "y = get_posemb(self, 'learn', (2, 2), 4, 'pos')\n")
  assert [m.test for m in learn.made] == [None] and _code(learn.made[0].call).startswith("self.param('pos'")
  (fixed,) = _calls(_file(tmp_path), "y = get_posemb(self, 'fixed', (2, 2), 4, 'pos')\n")
  assert fixed.made == ()
