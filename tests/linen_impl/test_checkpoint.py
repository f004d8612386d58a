"""Tests of `linen_impl.checkpoint`: restores are bit-identical and sharded."""

from __future__ import annotations

import jax
import pytest

from linen_impl import checkpoint
from tests.helpers import MATRIX, assert_sharded_as, assert_trees_bit_equal, matrix_id
from tests.linen_impl.test_train import run


@pytest.mark.parametrize(
    'case, optimizer',
    [(case, 'adam') for case in MATRIX[::3]]
    # (fsdp_sgd first: CI's every 6th case is the run the optimizer-state test makes.)
    + [(MATRIX[-1], 'fsdp_sgd'), (MATRIX[-1], 'sgd_momentum')],
    ids=lambda x: x if isinstance(x, str) else matrix_id(x),
)
def test_restore_is_bit_identical_and_sharded_alike(case, optimizer, tmp_path):
  r = run(case, optimizer)
  with jax.set_mesh(r['mesh']):
    checkpoint.save(tmp_path / 'ckpt', r['stepped'])
    restored = checkpoint.restore(tmp_path / 'ckpt', r['trainer'])
  assert_trees_bit_equal(restored, r['stepped'])
  saved_leaves = jax.tree.leaves(r['stepped'])
  for got, want in zip(jax.tree.leaves(restored), saved_leaves):
    assert_sharded_as(got, want.sharding, 'restored leaf')
  assert int(restored.step) == int(r['stepped'].step)
