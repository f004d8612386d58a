"""`sizes.readable` writes an expression equal to JAX's for every value."""

from __future__ import annotations

import ast

from hypothesis import example, given
from hypothesis import strategies as st

from converters.port.sizes import readable

SYMBOLS = ('a', 'b', 'c')


def _floordiv(x, k):
  return x // k


def _value(text: str, values: dict) -> int:
  return eval(text, {'floordiv': _floordiv, 'mod': lambda x, k: x % k}, dict(values))  # noqa: S307


expressions = st.recursive(
    st.sampled_from(SYMBOLS) | st.integers(-5, 9).map(str),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(['+', '-', '*']), inner).map(lambda t: f'({t[0]} {t[1]} {t[2]})'),
        st.tuples(inner, st.integers(1, 6)).map(lambda t: f'floordiv({t[0]}, {t[1]})'),
    ),
    max_leaves=8,
)


@given(expressions, st.fixed_dictionaries({s: st.integers(-50, 200) for s in SYMBOLS}))
def test_readable_equals_the_expression_for_every_value(text, values):
  assert _value(ast.unparse(readable(text)), values) == _value(text, values)


def test_poolings_read_as_a_person_writes_them():
  # What jax.export gives for two VALID 2x2 poolings of an h x w image, f channels.
  text = (
      'f*floordiv(floordiv(h - 2, 2) - 1, 2)*floordiv(floordiv(w - 2, 2) - 1, 2) + '
      'f*floordiv(floordiv(w - 2, 2) - 1, 2) + f*floordiv(floordiv(h - 2, 2) - 1, 2) + f'
  )
  assert ast.unparse(readable(text)) == 'f * (h // 4) * (w // 4)'


def test_common_factors_and_constants():
  assert ast.unparse(readable('2*a + 2')) == '2 * (a + 1)'
  assert ast.unparse(readable('3*a*b - 3*b')) == '3 * b * (a - 1)'
  assert ast.unparse(readable('floordiv(4*a + 8, 4)')) == 'a + 2'
  assert ast.unparse(readable('a')) == 'a'


def test_ceilings_and_signs_read_as_a_person_writes_them():
  # SAME padding with stride 8: jax.export's ceiling is `-floordiv(-h, 8)`.
  assert ast.unparse(readable('f*floordiv(-h, 8)*floordiv(-w, 8)')) == 'f * ((h + 7) // 8) * ((w + 7) // 8)'
  assert ast.unparse(readable('-floordiv(-h - 3, 4)')) == '(h + 2) // 4 + 1'
  assert ast.unparse(readable('3 - 2*a')) == '3 - 2 * a'
  assert ast.unparse(readable('-a*b')) == '-(a * b)'


# Sizes divided by a size of the configuration (a patch size `p`, at least 1)
# and `max(x, 0)` as jax.export bounds a convolution's output: every symbol
# a size (at least 0), as the port's are.
sized_expressions = st.recursive(
    # `p` a term too: `(h - p) // p`, the divisor's multiples taken out.
    st.sampled_from(SYMBOLS + ('p',)) | st.integers(-5, 9).map(str),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(['+', '-', '*']), inner).map(lambda t: f'({t[0]} {t[1]} {t[2]})'),
        st.tuples(inner, st.integers(1, 6)).map(lambda t: f'floordiv({t[0]}, {t[1]})'),
        inner.map(lambda e: f'floordiv({e}, p)'),
        inner.map(lambda e: f'-floordiv(-{e}, p)'),
        inner.map(lambda e: f'max({e}, 0)'),
    ),
    max_leaves=8,
)


# What a VALID and a SAME convolution of patch size p give, every CI run.
@example('max(floordiv(a - p, p) + 1, 0)', {'a': 7, 'b': 0, 'c': 0, 'p': 3})
@example('floordiv(-a + 2*p*b, p)', {'a': 10, 'b': 2, 'c': 0, 'p': 4})
@given(sized_expressions, st.fixed_dictionaries({**{s: st.integers(0, 200) for s in SYMBOLS}, 'p': st.integers(1, 9)}))
def test_readable_divides_by_sizes_exactly(text, values):
  assert _value(ast.unparse(readable(text)), {**values, 'max': max}) == _value(text, {**values, 'max': max})


def test_patches_read_as_a_person_writes_them():
  # A VALID convolution of patch size p over h x w, f features; a SAME one.
  valid = 'f*max(floordiv(h - p, p) + 1, 0)*max(floordiv(w - q, q) + 1, 0)'
  assert ast.unparse(readable(valid)) == 'f * (h // p) * (w // q)'
  assert ast.unparse(readable('floordiv(-h, p)*floordiv(-w, p)')) == '(h + p - 1) // p * ((p + w - 1) // p)'
  assert ast.unparse(readable('floordiv(h - 2*p, p)')) == 'h // p - 2'
  # Not a size at least 0 for every value: the bound stays.
  assert ast.unparse(readable('max(floordiv(h, p) - 3, 0)')) == 'max(h // p - 3, 0)'
