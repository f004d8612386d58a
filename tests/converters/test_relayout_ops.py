"""`relayout_ops`: each operation's values, and any region of them read back
from the regions of its inputs (as the streaming conversion reads them)."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from converters import relayout_ops


def _slices(region):
  return tuple(slice(a, b) for a, b in region)


def _regions(shape):
  """Every box of `shape` whose bounds are 0, 1, the middle or the end (empty ones too)."""
  bounds = [sorted({0, 1, n // 2, n} & set(range(n + 1))) for n in shape]
  per_axis = [[(a, b) for a in axis for b in axis if a <= b] for axis in bounds]
  return list(itertools.product(*per_axis))


_LAYERS = [np.arange(20, dtype=np.float32).reshape(4, 5) * (k + 1) for k in range(3)]
_STACKED = np.stack(_LAYERS)

CASES = {
    'keep': (relayout_ops.Keep(), [_STACKED], _STACKED),
    'stack': (relayout_ops.Stack(), _LAYERS, _STACKED),
    'slice': (relayout_ops.Slice(2), [_STACKED], _LAYERS[2]),
    'cast': (relayout_ops.Cast(np.dtype('int32')), [_STACKED], _STACKED.astype(np.int32)),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_values_on_the_host_and_on_device_are_the_operations_result(name):
  op, inputs, expected = CASES[name]
  np.testing.assert_array_equal(op.values(inputs, 1, np)[0], expected)
  on_device = op.values([jnp.asarray(x) for x in inputs], 1, jnp)[0]
  assert on_device.dtype == expected.dtype
  np.testing.assert_array_equal(np.asarray(on_device), expected)


@pytest.mark.parametrize('name', sorted(CASES))
def test_every_region_is_assembled_from_the_regions_of_the_inputs_it_reads(name):
  op, inputs, expected = CASES[name]
  for region in _regions(expected.shape):
    pieces = [inputs[k][_slices(r)] for k, r in op.reads(region)]
    got = op.assemble(pieces, region, expected.dtype)
    assert got.dtype == expected.dtype, region
    np.testing.assert_array_equal(got, expected[_slices(region)], err_msg=str(region))


def test_a_stack_of_parts_stacks_each_part_s_run_of_layers():
  # Two parts of three layers each, part after part: two stacks of three.
  parts = [np.full((2,), 10 * p + layer, np.float32) for p in range(2) for layer in range(3)]
  first, second = relayout_ops.Stack().values(parts, 2, np)
  np.testing.assert_array_equal(first[:, 0], [0, 1, 2])
  np.testing.assert_array_equal(second[:, 0], [10, 11, 12])


def test_operations_are_values_usable_as_keys():
  # (A jitted relayout is cached by its recipe, operations included.)
  assert relayout_ops.Slice(1) == relayout_ops.Slice(1) != relayout_ops.Slice(2)
  assert len({relayout_ops.Keep(), relayout_ops.Keep(), relayout_ops.Stack(), relayout_ops.Cast(np.dtype('int32'))}) == 3
