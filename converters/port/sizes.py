"""Sizes written as a person would write them.

`jax.export` keeps a symbolic size as a sum of monomials, which is exact but
not what anyone writes: two 2x2 poolings of `h` by `w` images with `f`
channels read `f*floordiv(floordiv(h - 2, 2) - 1, 2)*floordiv(...) + ...`.
`readable(text)` rewrites such an expression (as `str` gives it) into an
equal one: constants taken out of floor divisions (`(h - 2) // 2` is `h // 2
- 1` for integers), nested divisions merged (`h // 2 // 2` is `h // 4`), and
the sum factored where it is a product (`f * (h // 4) * (w // 4)`).
"""

from __future__ import annotations

import ast
import math
from collections import Counter

Monomial = tuple[str, ...]  # sorted atom keys, repeated for powers
Poly = dict[Monomial, int]


class _Atoms:
  """Atom key -> its expression (a symbol, or a call kept whole)."""

  def __init__(self):
    self.nodes: dict[str, ast.expr] = {}

  def atom(self, node: ast.expr) -> Poly:
    key = ast.unparse(node)
    self.nodes.setdefault(key, node)
    return {(key,): 1}


def _add(a: Poly, b: Poly, sign: int = 1) -> Poly:
  out = dict(a)
  for m, c in b.items():
    out[m] = out.get(m, 0) + sign * c
  return {m: c for m, c in out.items() if c}


def _mul(a: Poly, b: Poly) -> Poly:
  out: Poly = {}
  for ma, ca in a.items():
    for mb, cb in b.items():
      m = tuple(sorted(ma + mb))
      out[m] = out.get(m, 0) + ca * cb
  return {m: c for m, c in out.items() if c}


def _poly(node: ast.expr, atoms: _Atoms) -> Poly:
  if isinstance(node, ast.Constant) and isinstance(node.value, int):
    return {(): node.value} if node.value else {}
  if isinstance(node, ast.Name):
    return atoms.atom(node)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return {m: -c for m, c in _poly(node.operand, atoms).items()}
  if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
    return _add(_poly(node.left, atoms), _poly(node.right, atoms), 1 if isinstance(node.op, ast.Add) else -1)
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
    return _mul(_poly(node.left, atoms), _poly(node.right, atoms))
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
    if node.func.id == 'floordiv' and _positive_int(node.args[1]):
      return _floordiv(_poly(node.args[0], atoms), node.args[1].value, atoms)
    if node.func.id == 'floordiv' and isinstance(node.args[1], ast.Name):
      return _floordiv_by_symbol(_poly(node.args[0], atoms), _poly(node.args[1], atoms), atoms)
    bounded = _bounded_at_zero(node)
    if bounded is not None and _never_negative(inner := _poly(bounded, atoms), atoms):
      return inner  # `max(x, 0)` of an `x` never negative: `x`
    args = [_expression(_poly(a, atoms), atoms) for a in node.args]
    return atoms.atom(ast.Call(node.func, args, []))
  return atoms.atom(node)


def _floordiv_by_symbol(inner: Poly, divisor: Poly, atoms: _Atoms) -> Poly:
  """`inner // d` for a size `d` (a patch size, at least 1): the terms of
  `inner` that are multiples of `d` taken out (`(h - p) // p` is `h // p -
  1`), exactly, for integer values of the symbols."""
  ((key,),) = divisor  # one symbol, of coefficient 1
  quotient = {tuple(a for i, a in enumerate(m) if i != m.index(key)): c for m, c in inner.items() if key in m}
  rest = {m: c for m, c in inner.items() if key not in m}
  if not rest:
    return quotient
  if any(m for m in rest) and all(c < 0 for m, c in rest.items() if m):
    # A ceiling (`-floordiv(-h, p)`, a 'SAME' convolution's): `-x // d` is
    # `-((x + d - 1) // d)`, which a person writes `(h + p - 1) // p`.
    up = _add(_add({m: -c for m, c in rest.items()}, divisor), {(): -1})
    ceiling = atoms.atom(ast.Call(ast.Name('floordiv'), [_expression(up, atoms), atoms.nodes[key]], []))
    return _add({m: -c for m, c in ceiling.items()}, quotient)
  node = ast.Call(ast.Name('floordiv'), [_expression(rest, atoms), atoms.nodes[key]], [])
  return _add(atoms.atom(node), quotient)


def _never_negative(poly: Poly, atoms: _Atoms) -> bool:
  """Whether `poly` is at least 0 for every value of its symbols, all sizes
  (at least 0): a sum of positive terms of sizes and of their floor
  divisions by positive sizes."""
  def size(key: str) -> bool:
    node = atoms.nodes[key]
    if isinstance(node, ast.Name):
      return True
    if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'floordiv':
      numerator, denominator = node.args
      return (_positive_int(denominator) or isinstance(denominator, ast.Name)) and _never_negative(
          _poly(numerator, atoms), atoms)
    return _bounded_at_zero(node) is not None

  return all(c > 0 for c in poly.values()) and all(size(a) for m in poly for a in m)


def _bounded_at_zero(node: ast.expr) -> ast.expr | None:
  """`x` of `max(x, 0)`, `max(0, x)` or `non_negative(x)` (as jax.export
  bounds a convolution's output size), else None."""
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
    return None
  if node.func.id == 'non_negative' and len(node.args) == 1:
    return node.args[0]
  zero = [isinstance(a, ast.Constant) and a.value == 0 for a in node.args]
  if node.func.id == 'max' and len(node.args) == 2 and any(zero):
    return node.args[zero.index(False)] if not all(zero) else node.args[0]
  return None


def _positive_int(node) -> bool:
  return isinstance(node, ast.Constant) and isinstance(node.value, int) and node.value > 0


def _floordiv(inner: Poly, k: int, atoms: _Atoms) -> Poly:
  """`inner // k`, exactly, for integer values of the symbols."""
  if all(c % k == 0 for c in inner.values()):
    return {m: c // k for m, c in inner.items()}
  if any(m for m in inner) and all(c < 0 for m, c in inner.items() if m):
    # A ceiling, as `jax.export` writes one (`-floordiv(-h, 8)`): `-p // k`
    # is `-((p + k - 1) // k)`, which a person writes `(h + 7) // 8`.
    ceiling = _floordiv(_add({m: -c for m, c in inner.items()}, {(): k - 1}), k, atoms)
    return {m: -c for m, c in ceiling.items()}
  constant = inner.get((), 0)
  rest = {m: c for m, c in inner.items() if m}
  shift = constant // k  # (x + c) // k == (x + c % k) // k + c // k
  rest_constant = constant - shift * k
  base = _add(rest, {(): rest_constant} if rest_constant else {})
  # ((x // a) // b) == x // (a * b) for positive a, b
  if len(base) == 1 and list(base.values()) == [1] and len(next(iter(base))) == 1:
    (key,) = next(iter(base))
    node = atoms.nodes.get(key)
    if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'floordiv' and _positive_int(node.args[1]):
      merged = ast.Call(ast.Name('floordiv'), [node.args[0], ast.Constant(node.args[1].value * k)], [])
      return _add(atoms.atom(merged), {(): shift} if shift else {})
  node = ast.Call(ast.Name('floordiv'), [_expression(base, atoms), ast.Constant(k)], [])
  return _add(atoms.atom(node), {(): shift} if shift else {})


def _expression(poly: Poly, atoms: _Atoms) -> ast.expr:
  """`poly` as an expression, factored where it is a product."""
  if not poly:
    return ast.Constant(0)
  # A factor every monomial has.
  common = None
  for m in poly:
    counts = Counter(m)
    common = counts if common is None else common & counts
  gcd = math.gcd(*poly.values())
  if any(c < 0 for c in poly.values()) and all(c < 0 for c in poly.values()):
    gcd = -gcd
  factors: list[ast.expr] = []
  if common:
    poly = {tuple(sorted((Counter(m) - common).elements())): c for m, c in poly.items()}
    factors += [atoms.nodes[a] for a in sorted(common.elements())]
  if abs(gcd) > 1 and len(poly) > 1:
    poly = {m: c // gcd for m, c in poly.items()}
    factors.insert(0, ast.Constant(gcd))
  # (a + 1) * p == a * p + p, for an atom a of degree one in every monomial.
  if len(poly) > 1:
    for key in sorted({a for m in poly for a in m}):
      with_a = {tuple(x for x in m if x != key): c for m, c in poly.items() if key in m}
      without = {m: c for m, c in poly.items() if key not in m}
      if with_a == without and all(Counter(m)[key] == 1 for m in poly if key in m):
        factors.append(ast.BinOp(atoms.nodes[key], ast.Add(), ast.Constant(1)))
        poly = without
        return _product(factors + [_expression(poly, atoms)])
  return _product(factors + [_sum(poly, atoms)])


def _product(factors: list[ast.expr]) -> ast.expr:
  # A negative constant factor is a sign in front: `-(h // 4 + 1)`, not `(h // 4 + 1) * -1`.
  factors = [ast.Constant(-f.operand.value) if isinstance(f, ast.UnaryOp) and isinstance(f.op, ast.USub)
             and isinstance(f.operand, ast.Constant) else f for f in factors]
  negative = sum(isinstance(f, ast.Constant) and f.value < 0 for f in factors) % 2
  factors = [ast.Constant(-f.value) if isinstance(f, ast.Constant) and f.value < 0 else f for f in factors]
  factors = [f for f in factors if not (isinstance(f, ast.Constant) and f.value == 1)] or [ast.Constant(1)]
  node = factors[0]
  for f in factors[1:]:
    node = ast.BinOp(node, ast.Mult(), f)
  return ast.UnaryOp(ast.USub(), node) if negative else node


def _sum(poly: Poly, atoms: _Atoms) -> ast.expr:
  # Highest degree first, a positive term leading where there is one (`3 - 2 * h`).
  terms = sorted(poly.items(), key=lambda mc: (mc[1] < 0, -len(mc[0]), mc[0]))
  node = None
  for m, c in terms:
    term = _product(([ast.Constant(abs(c))] if abs(c) != 1 or not m else []) + [atoms.nodes[a] for a in m])
    if node is None and c < 0 and abs(c) != 1 and m:
      node = ast.BinOp(ast.Constant(c), ast.Mult(), _product([atoms.nodes[a] for a in m]))  # `-2 * h`
    elif node is None:
      node = term if c > 0 else ast.UnaryOp(ast.USub(), term)
    else:
      node = ast.BinOp(node, ast.Add() if c > 0 else ast.Sub(), term)
  return node


class _Calls(ast.NodeTransformer):
  """`floordiv(a, b)` -> `a // b`, `mod(a, b)` -> `a % b`."""

  def visit_Call(self, node):
    self.generic_visit(node)
    name = getattr(node.func, 'id', None)
    if name == 'floordiv':
      return ast.BinOp(node.args[0], ast.FloorDiv(), node.args[1])
    if name == 'mod':
      return ast.BinOp(node.args[0], ast.Mod(), node.args[1])
    if name == 'non_negative':
      return ast.Call(ast.Name('max'), [node.args[0], ast.Constant(0)], [])
    return node


def readable(text: str) -> ast.expr:
  """An expression equal to `text` (a `jax.export` size) for every integer
  value of its symbols, written as a person would."""
  atoms = _Atoms()
  tree = _expression(_poly(ast.parse(text, mode='eval').body, atoms), atoms)
  return _Calls().visit(tree)
