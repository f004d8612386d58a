"""A size traced at several values of a count, fitted as one expression of it.

A count is an integer the symbolic trace keeps concrete (a loop's length, an
input's width the code splits, a tuple's length): traced again at other
values, a size that changes with it is written with it where its values lie
on a line of the count (`linear`) or, over a tuple's length, read alike but
for constants that grow by a step or a ratio (`over_length`). A size no fit
writes is `Unfitted`: right at the traced configuration only.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from converters.port import sizes


class Unfitted:
  """A size that changes with a count or a tuple's length in a way no fit
  writes (`2 ** n` of a count, say): its traced value, which holds at the
  traced configuration only, so writing it is refused."""

  def __init__(self, value, what: str):
    self.value, self.what = value, what

  def __str__(self) -> str:
    return str(self.value)


class Fitted:
  """A size fitted over several lengths of a tuple: Python source over the
  table's symbols (`s3 // 2 ** s7`), which jax's sizes cannot say."""

  def __init__(self, text: str):
    self.text = text

  def __str__(self) -> str:
    return self.text


def far_counts(base: int, step: int) -> list[int]:
  """Counts far from `base` in its steps, where a size fitted near it must
  still hold: the smallest (`step`) and about four times `base`."""
  high = base + step * max(3, 3 * base // step)
  return [n for n in (step, high) if n not in (base, base + step, base + 2 * step)]


def linear(values, symbol, base: int, what: str = 'a count', step: int = 1, far: Sequence[int] = ()):
  """`e(n)` from its values at `base`, `base + step` and `base + 2 * step`
  if they lie on a line of whole slope (`e0 + slope * (n - base)`), else
  `Unfitted`; the values after those three are at the counts `far` (far
  from the traced one, below and above), where the line must hold too: a
  size near the traced count only (`max(width, 16)`) is not a line."""
  fitted = _line(values[:3], symbol, base, what, step)
  if isinstance(fitted, Unfitted) or not far:
    return fitted
  e0, e1 = values[:2]
  for n, e in zip(far, values[3:], strict=True):
    try:
      slope = (e1 - e0) // step
      if isinstance(slope, int) and isinstance(e, int) and isinstance(e0, int) and e != e0 + slope * (n - base):
        return Unfitted(e0, what)
    except Exception:  # noqa: BLE001 - a comparison jax cannot decide: the other traces decide
      continue
  return fitted


def _line(values, symbol, base: int, what: str, step: int):
  e0, e1, e2 = values
  if not isinstance(e0, int) and isinstance(e1, int) and isinstance(e2, int) and e1 == e2:
    # Unchanged by this count; `e0` is already written with another one
    # (`config.width`, fitted first), whose traces these are not.
    return e0
  try:
    difference = e1 - e0
    if not (e2 - e1 == difference):
      return Unfitted(e0, what)
    if isinstance(difference, int) and difference == 0:
      return e0
    if difference % step != 0:
      return Unfitted(e0, what)
    return e0 + difference // step * (symbol - base)
  except Exception:  # noqa: BLE001 - a comparison jax cannot decide
    return e0 if str(e0) == str(e1) == str(e2) else Unfitted(e0, what)


def over_length(values, length: str, order: Sequence[int], base: int, what: str):
  """A size at three lengths of a tuple as one expression of the length
  symbol `length`: `values[i]` for `i` in `order` are at `base`, one and two
  more; `Unfitted` (its traced value, `values[0]`) if `_fit_length` finds
  none."""
  fitted = _fit_length(tuple(values[i] for i in order), length, base)
  if fitted is None:
    return Unfitted(values[0], what)
  return fitted


def _fit_length(values, length: str, base: int):
  """A size at three lengths of a tuple (`base`, one and two more) as one
  expression of the length `length`: the three read alike but for integer
  constants, each of which grows by a step (`c + d * (n - base)`) or a
  ratio (`c * r ** (n - base)`). None if they do not."""
  texts = [ast.parse(str(v), mode='eval').body if isinstance(v, Fitted)
           else sizes.readable(str(v)) if not isinstance(v, int) else ast.Constant(v) for v in values]
  if len({ast.dump(t) for t in texts}) == 1:
    return values[0]  # the same at every length
  n = ast.Name(length)

  def fit(a, b, c):
    if type(a) is not type(b) or type(b) is not type(c):
      raise ValueError
    if isinstance(a, ast.Constant):
      return _fit_constant(a, b, c, n, base)
    fields = {}
    for field, x in ast.iter_fields(a):
      y, z = getattr(b, field), getattr(c, field)
      if isinstance(x, ast.AST):
        fields[field] = fit(x, y, z)
      elif isinstance(x, list):
        if not len(x) == len(y) == len(z):
          raise ValueError
        fields[field] = [fit(p, q, r) if isinstance(p, ast.AST) else p for p, q, r in zip(x, y, z)]
      elif x != y or y != z:
        raise ValueError
      else:
        fields[field] = x
    return type(a)(**fields)

  try:
    return Fitted(ast.unparse(fit(*texts)))
  except (ValueError, AttributeError, TypeError):
    return None


def _fit_constant(a: ast.Constant, b: ast.Constant, c: ast.Constant, n: ast.Name, base: int) -> ast.expr:
  """One constant of a size at three lengths of a tuple as an expression of
  the length `n`: itself, a step (`d * n + c`) or a ratio (`c * r ** n`).
  Raises ValueError if it is none of them."""
  c0, c1, c2 = a.value, b.value, c.value
  if c0 == c1 == c2:
    return a
  if not all(isinstance(x, int) for x in (c0, c1, c2)):
    raise ValueError
  if c1 - c0 == c2 - c1:
    step = c1 - c0
    offset = c0 - step * base
    term = ast.BinOp(ast.Constant(step), ast.Mult(), n) if step != 1 else n
    return term if offset == 0 else ast.BinOp(term, ast.Add() if offset > 0 else ast.Sub(), ast.Constant(abs(offset)))
  if c0 and c1 % c0 == 0 and c2 % c1 == 0 and c1 // c0 == c2 // c1 > 1:
    ratio = c1 // c0
    power = ast.BinOp(ast.Constant(ratio), ast.Pow(), n)
    if c0 % ratio ** base == 0:
      factor = c0 // ratio ** base
      return power if factor == 1 else ast.BinOp(ast.Constant(factor), ast.Mult(), power)
  raise ValueError
