"""Comparing arrays: bit for bit, or within an absolute tolerance, and where they differ most.

One definition for every check the kit makes: the equivalence assertions
(`converters.testing`), the checkpoint comparison (`converters.checkpoint.
compare`) and the read-back verification (`converters.checkpoint.verify`).

- Bit for bit (`atol=0`, the default everywhere): the arrays' bits, read as
  unsigned integers of their width, so a NaN equals the same NaN and -0.0
  differs from 0.0.
- Within `atol > 0`: inexact elements (any float, bfloat16 and float8
  included, and complex) may differ by at most `atol`, NaNs where both hold
  one; integers and booleans still compare exactly (a tolerance is for
  rounding, which they do not do).
- Arrays of another shape or dtype always differ.
- `largest_difference` says where two arrays of one shape differ most, in
  float64 (complex128) on the host: a NaN on one side only comes first (its
  difference is NaN), NaNs on both sides count as equal.
- `bits_equal` and `leaf_difference` compare arrays where they are, for
  arrays too large to gather: shard by shard when their shardings match.
- Typed PRNG keys (`jax.random.key`) compare by their key data; keys of
  another implementation are of another dtype, so they differ.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ['LeafRelative']


def _is_key(x) -> bool:
  dtype = getattr(x, 'dtype', None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def as_key_data(x):
  """A typed PRNG key array as its key data, which numpy can read and Orbax
  writes; anything else as it is."""
  return jax.random.key_data(x) if _is_key(x) else x


def host_bits(x) -> np.ndarray:
  """`x` on the host as unsigned integers of its width (a 0-d array as shape (1,));
  16-byte elements (complex128) as raw 16-byte values."""
  x = np.asarray(jax.device_get(as_key_data(x)))
  width = x.dtype.itemsize
  return (x.reshape(1) if x.ndim == 0 else x).view(f'u{width}' if width <= 8 else f'V{width}')


def _inexact(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.inexact)  # numpy calls bfloat16 and float8 kind 'V'


def _widened(x: np.ndarray) -> np.ndarray:
  return x.astype(np.complex128 if jnp.issubdtype(x.dtype, jnp.complexfloating) else np.float64)


_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def device_bits(x: jax.Array) -> jax.Array:
  """`x` where it is, its inexact elements viewed as unsigned integers of their
  width (a complex element as its real and imaginary parts, on a last axis)."""
  x = as_key_data(x)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    x = jnp.stack([x.real, x.imag], axis=-1)
  if jnp.issubdtype(x.dtype, jnp.floating):
    return jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
  return x


def largest_difference(a, b) -> tuple[float, tuple[int, ...]]:
  """`(max |a - b|, its index)` of two arrays of one shape; `(0.0, ())` if
  empty, `(inf, ())` if their elements are of other shapes (keys of two
  implementations)."""
  x, y = (np.asarray(jax.device_get(as_key_data(v))) for v in (a, b))
  if x.shape != y.shape:
    return float('inf'), ()
  if x.size == 0:
    return 0.0, ()
  x, y = _widened(x), _widened(y)
  with np.errstate(invalid='ignore'):  # inf - inf, where x == y says they are equal
    diff = np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0.0, np.abs(x - y))
  where = np.unravel_index(int(np.argmax(np.where(np.isnan(diff), np.inf, diff))), diff.shape)
  return float(diff[where]), tuple(int(i) for i in where)


class LeafRelative(float):
  """A tolerance relative to each compared leaf's largest magnitude (of the
  expected side): `LeafRelative(1e-5)` admits differences up to 1e-5 times
  the largest `|x|` of that leaf, so it scales with the leaf, never admitting
  a difference as large as a small leaf's values. Otherwise it is the float
  it holds (reported, compared, formatted as one)."""

  def __repr__(self) -> str:
    return f'{float(self):g} of each leaf\'s largest value'

  __str__ = __repr__


def differs(a, b, atol: float = 0.0) -> bool:
  """Whether two arrays of one shape and dtype differ: bit for bit, or by
  more than `atol` (of each leaf's largest value, for a `LeafRelative`)."""
  if (_is_key(a) or _is_key(b)) and a.dtype != b.dtype:
    return True  # a key against another implementation's, or against raw key data
  x, y = (np.asarray(jax.device_get(as_key_data(v))) for v in (a, b))
  if x.shape != y.shape or x.dtype != y.dtype:
    return True
  if np.array_equal(host_bits(x), host_bits(y)):
    return False
  if atol > 0 and _inexact(x.dtype):
    if isinstance(atol, LeafRelative):
      atol = float(atol) * float(np.max(np.abs(_widened(x)), initial=0.0))
    return not np.allclose(_widened(x), _widened(y), rtol=0, atol=atol, equal_nan=True)
  return True


def describe_difference(a, b) -> str:
  """Where two arrays differ most, for a message; their shapes and dtypes if those differ."""
  a_dtype, b_dtype = (v.dtype if hasattr(v, 'dtype') else np.asarray(v).dtype for v in (a, b))
  if np.shape(a) != np.shape(b) or a_dtype != b_dtype:
    return f'{np.shape(a)} {a_dtype} vs {np.shape(b)} {b_dtype}'
  if _is_key(a) or not _inexact(a_dtype):
    return 'values differ'
  diff, where = largest_difference(a, b)
  return f'max abs diff {diff:.3g} at {where}'


@jax.jit
def _difference(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  equal = jnp.all(device_bits(a) == device_bits(b))
  wide = jnp.complex64 if jnp.issubdtype(a.dtype, jnp.complexfloating) else jnp.float32
  diff = jnp.abs(a.astype(wide) - b.astype(wide))
  return equal, jnp.max(diff, initial=0.0)


def bits_equal(xs: list[jax.Array], ys: list[jax.Array]) -> list[bool]:
  """Whether each `xs[i]` equals `ys[i]` bit for bit.

  Arrays with the same sharding are compared shard by shard, only the shards
  this process holds, with no compilation and no gathering; others on device.
  """
  if len(xs) != len(ys):
    raise ValueError(
        f'bits_equal: {len(xs)} arrays against {len(ys)}; compare the leaves of '
        'trees of one structure'
    )
  out = []
  for x, y in zip(xs, ys):
    if x.shape != y.shape or x.dtype != y.dtype:
      out.append(False)
    elif x.sharding == y.sharding:
      pairs = zip(
          sorted(x.addressable_shards, key=lambda s: s.device.id),
          sorted(y.addressable_shards, key=lambda s: s.device.id),
      )
      out.append(all(np.array_equal(host_bits(a.data), host_bits(b.data)) for a, b in pairs))
    else:
      out.append(bool(_difference(as_key_data(x), as_key_data(y))[0]))
  return out


def leaf_difference(a: jax.Array, b: jax.Array) -> tuple[bool, float]:
  """`(bit-identical, max |a - b| in float32)`, computed on device; `(False, nan)`
  for arrays of other shapes or dtypes, and for keys that differ (the
  difference of key words means nothing)."""
  if a.shape != b.shape or a.dtype != b.dtype:
    return False, float('nan')
  equal, diff = _difference(as_key_data(a), as_key_data(b))
  if _is_key(a):
    return bool(equal), 0.0 if equal else float('nan')
  return bool(equal), float(diff)
