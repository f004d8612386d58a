"""Tests of `converters.comparison`: bit for bit, within a tolerance, on the host
and where the arrays are."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from converters.comparison import (
    LeafRelative, bits_equal, describe_difference, differs, host_bits, largest_difference, leaf_difference,
)


def test_bit_for_bit_tells_signed_zeros_apart_and_matches_nans():
  x = np.array([0.0, np.nan, 1.0], np.float32)
  assert not differs(x, x.copy())
  assert differs(x, np.array([-0.0, np.nan, 1.0], np.float32))
  assert not differs(jnp.asarray(x), x)  # on device or on the host alike
  assert host_bits(np.float32(1.0)).shape == (1,)


def test_a_tolerance_is_for_inexact_elements_only():
  x = np.array([1.0, np.nan], np.float32)
  assert not differs(x, x + np.float32(1e-6), atol=1e-5)
  assert differs(x, x + np.float32(1e-4), atol=1e-5)
  assert differs(x, np.array([1.0, 2.0], np.float32), atol=1e3)  # a NaN on one side only
  assert differs(np.array([1, 2]), np.array([1, 3]), atol=5)  # integers do not round
  half = jnp.array([1.0, 2.0], jnp.bfloat16)  # numpy's kind 'V', a float all the same
  assert not differs(half, half + jnp.bfloat16(0.0078125), atol=0.1)
  assert differs(half, half + jnp.bfloat16(0.5), atol=0.1)
  z = np.array([1 + 1j], np.complex128)
  assert not differs(z, z + 1e-9j, atol=1e-6) and differs(z, z + 1e-3j, atol=1e-6)


def test_a_leaf_relative_tolerance_scales_with_the_leaf():
  tolerance = LeafRelative(1e-5)
  big = np.array([1.0, -2.0], np.float32)
  assert not differs(big, big + np.float32(1e-6), atol=tolerance)  # a few ulp of 2
  assert differs(big, big + np.float32(1e-4), atol=tolerance)
  # A small leaf's values swapped are far outside it, where 1e-6 absolute admits them.
  small = np.array([1e-7, 3e-7], np.float32)
  assert differs(small, small[::-1].copy(), atol=tolerance)
  assert not differs(small, small[::-1].copy(), atol=1e-6)
  assert differs(np.zeros(2, np.float32), np.array([0.0, 1e-30], np.float32), atol=tolerance)
  assert str(tolerance) == "1e-05 of each leaf's largest value" and tolerance > 0


def test_arrays_of_another_dtype_or_shape_differ_whatever_their_values():
  assert differs(np.zeros(2, np.float32), np.zeros(2, jnp.bfloat16))
  assert differs(np.arange(3, dtype=np.int8), np.arange(3, dtype=np.int32))
  assert differs(np.zeros(2), np.zeros(3)) and differs(np.zeros(2), np.zeros(2), atol=1) is False
  z = np.array([1 + 2j, 3j], np.complex128)  # 16-byte elements: compared as raw bytes
  assert not differs(z, z.copy()) and differs(z, z + 1)


def test_largest_difference_says_where():
  x = np.zeros((2, 3), np.float32)
  y = x.copy()
  y[1, 2] = -0.5
  y[0, 1] = 0.25
  assert largest_difference(x, y) == (0.5, (1, 2))
  y[0, 0] = np.nan  # a NaN on one side only comes first
  diff, where = largest_difference(x, y)
  assert np.isnan(diff) and where == (0, 0)
  assert largest_difference(np.full(2, np.nan), np.full(2, np.nan)) == (0.0, (0,))
  assert largest_difference(np.zeros((0, 3)), np.zeros((0, 3))) == (0.0, ())
  assert largest_difference(np.array([1j]), np.array([0j])) == (1.0, (0,))
  assert describe_difference(x, y) == 'max abs diff nan at (0, 0)'
  assert describe_difference(np.array([True]), np.array([False])) == 'values differ'
  assert describe_difference(np.array([1, 2]), np.array([1, 3])) == 'values differ'


def _sharded(x, spec):
  mesh = jax.make_mesh((2, 4), ('data', 'model'))
  return jax.device_put(x, NamedSharding(mesh, spec))


def test_bits_equal_compares_bits_shard_by_shard_and_across_shardings():
  x = jnp.arange(32.0).reshape(4, 8).at[0, 0].set(jnp.nan)
  a = _sharded(x, P('data', 'model'))
  assert bits_equal([a], [_sharded(x, P('data', 'model'))]) == [True]  # NaN == NaN by bits
  assert bits_equal([a], [_sharded(x, P(None, 'model'))]) == [True]  # on device
  assert bits_equal([a], [_sharded(x.at[3, 7].add(1.0), P('data', 'model'))]) == [False]
  assert bits_equal([_sharded(jnp.zeros(8), P())], [_sharded(-jnp.zeros(8), P())]) == [False]
  assert bits_equal([a], [_sharded(x.astype(jnp.bfloat16), P('data', 'model'))]) == [False]


def test_bits_equal_refuses_lists_of_different_lengths():
  a = _sharded(jnp.zeros(8), P())
  with pytest.raises(ValueError, match='1 arrays against 2; compare the leaves of trees of one structure'):
    bits_equal([a], [a, a])  # zip would drop the second and call them equal


def test_leaf_difference_reports_the_largest_absolute_difference():
  x = jnp.arange(8.0)
  same, diff = leaf_difference(x, x.at[5].add(0.25))
  assert not same and diff == pytest.approx(0.25)
  assert leaf_difference(x, x) == (True, 0.0)
  assert np.isnan(leaf_difference(x, x[:4])[1])


def test_typed_prng_keys_compare_by_their_key_data():
  key, other = jax.random.key(0), jax.random.key(1)
  assert not differs(key, jax.random.key(0)) and differs(key, other)
  assert bits_equal([key, key], [jax.random.key(0), other]) == [True, False]
  assert leaf_difference(key, jax.random.key(0))[0] and not leaf_difference(key, other)[0]
  assert describe_difference(key, other) == 'values differ'
  assert np.array_equal(host_bits(key), np.asarray(jax.random.key_data(key)))


def test_a_key_differs_from_another_implementations_and_from_raw_key_data():
  key = jax.random.key(0)
  assert differs(key, jax.random.key(0, impl='rbg'))
  assert differs(key, jax.random.key_data(key))
  assert differs(jax.random.key_data(key), key)


def test_float8_and_complex_arrays_compare_where_they_are():
  x8 = jnp.asarray([1.0, 2.0], jnp.float8_e4m3fn)
  assert leaf_difference(x8, x8) == (True, 0.0)
  assert not leaf_difference(x8, jnp.asarray([1.0, 3.0], jnp.float8_e4m3fn))[0]
  z = jnp.asarray([1 + 1j, 2 + 0j], jnp.complex64)
  equal, diff = leaf_difference(z, z + 1j)
  assert not equal and diff == pytest.approx(1.0)
  nan = jnp.asarray([complex(np.nan, 0)], jnp.complex64)
  assert leaf_difference(nan, nan)[0]  # the same bits, as on the host
  assert not leaf_difference(jnp.asarray([0j], jnp.complex64), jnp.asarray([complex(-0.0, 0)], jnp.complex64))[0]
  assert bits_equal([nan], [nan]) == [True]


def test_equal_infinities_are_not_the_largest_difference():
  assert largest_difference(np.asarray([np.inf, 1.0]), np.asarray([np.inf, 2.0])) == (1.0, (1,))


def test_keys_of_two_implementations_have_no_difference_to_measure():
  a, b = jax.random.key(0), jax.random.key(0, impl='rbg')
  assert largest_difference(a[None], b[None]) == (float('inf'), ())
  key, other = jax.random.key(0), jax.random.key(1)
  equal, diff = leaf_difference(key, other)
  assert not equal and np.isnan(diff)


def test_a_difference_of_dtype_is_described_as_one():
  assert describe_difference(np.zeros(2, np.float32), np.zeros(2, np.int32)) == '(2,) float32 vs (2,) int32'
