"""Tests of `converters.planning`: the plan is pure and names every problem."""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest

from converters import relayout_ops
from converters.errors import LayoutError, PathMappingError, StructureError
from converters.metadata import Annotation
from converters.paths import PathMapping, PathRule
from converters.planning import plan

LAYERS = PathMapping([PathRule('Block_{i}/w', 'blocks/{i}/w', linen_stacked='Blocks/w', nnx_stacked='blocks/w')])


def leaf(*shape, names=None):
  return jax.ShapeDtypeStruct(shape, np.float32), Annotation(names=names)


def test_a_plan_decides_every_leaf_and_touches_nothing():
  flat = {('Block_0', 'w'): leaf(4, 8, names=('data', None)), ('Block_1', 'w'): leaf(4, 8, names=('data', None))}
  before = copy.deepcopy(flat)
  result = plan(flat, LAYERS, 'linen', 'nnx', scan=True, layer_partition='layers')
  assert flat == before
  assert result.refusal() is None
  (path, target), = result.targets.items()
  assert path == ('blocks', 'w')
  assert (target.op, target.shape) == (relayout_ops.Stack(), (2, 4, 8))
  assert target.sources == (('Block_0', 'w'), ('Block_1', 'w'))
  assert target.annotation.names == ('layers', 'data', None)


def test_unstacking_slices_each_layer_and_drops_the_layer_name():
  flat = {('blocks', 'w'): leaf(3, 4, names=('layers', 'data'))}
  result = plan(flat, LAYERS, 'nnx', 'linen', scan=False)
  assert sorted(result.targets) == [(f'Block_{i}', 'w') for i in range(3)]
  assert {type(t.op) for t in result.targets.values()} == {relayout_ops.Slice}
  assert [t.op for _, t in sorted(result.targets.items())] == [relayout_ops.Slice(i) for i in range(3)]
  assert {t.annotation.names for t in result.targets.values()} == {('data',)}


def test_problems_are_returned_not_raised_and_name_every_offender():
  flat = {
      ('Blocks', 'w'): leaf(3, 4),
      ('Block_0', 'w'): leaf(4),
      ('Block_2', 'w'): leaf(4),
  }
  result = plan(flat, LAYERS, 'linen', 'nnx', scan=True, num_layers=2)
  error = result.refusal()
  assert isinstance(error, (StructureError, LayoutError))
  assert 'Blocks/w' in str(error)  # stacked axis 3, not 2
  assert 'Block_1/w' in str(error)  # missing layer
  assert 'Block_2/w' in str(error)  # beyond num_layers


def test_two_sources_of_one_target_are_a_mapping_refusal():
  mapping = PathMapping([PathRule('a', 'x')], keep_unmatched=True)
  result = plan({('a',): leaf(2), ('x',): leaf(2)}, mapping, 'linen', 'nnx')
  error = result.refusal()
  assert isinstance(error, PathMappingError)
  assert 'x <- a & x' in str(error)


def test_a_target_inside_another_target_is_refused():
  mapping = PathMapping([PathRule('a', 'x'), PathRule('b', 'x/y')])
  error = plan({('a',): leaf(2), ('b',): leaf(2)}, mapping, 'linen', 'nnx').refusal()
  assert isinstance(error, PathMappingError)
  assert 'x/y inside x' in str(error)


@pytest.mark.parametrize('scan', [None, False])
def test_leaves_whose_layout_is_kept_are_their_sources(scan):
  flat = {('Block_0', 'w'): leaf(4), ('Block_1', 'w'): leaf(4)}
  result = plan(flat, LAYERS, 'linen', 'nnx', scan=scan)
  assert result.refusal() is None
  assert sorted(t.sources for t in result.targets.values()) == [(('Block_0', 'w'),), (('Block_1', 'w'),)]
  assert all(t.kept for t in result.targets.values())
