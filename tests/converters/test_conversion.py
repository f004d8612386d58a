"""Tests of `converters.conversion`: every tree checked before anything is built."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from converters.conversion import Conversion, Pending
from converters.errors import PathMappingError, StructureError
from converters.metadata import Annotation
from converters.options import Options
from converters.paths import PathMapping, PathRule

LAYERS = PathMapping([PathRule('Block_{i}/w', 'blocks/{i}/w', linen_stacked='Blocks/w', nnx_stacked='blocks/w')])


def layers(*arrays):
  return {(f'Block_{i}', 'w'): (a, Annotation()) for i, a in enumerate(arrays)}


def test_collections_that_meet_at_one_path_are_refused():
  conversion = Conversion(Options(paths=PathMapping.identity()))
  flat = {('x',): (jnp.zeros(2), Annotation())}
  with pytest.raises(StructureError, match=r'x \(params and batch_stats\)'):
    conversion.add_collections({'params': flat, 'batch_stats': dict(flat)}, 'linen', 'nnx')


def test_an_unmapped_source_path_is_named_with_the_targets_unmapped_paths():
  conversion = Conversion(Options(paths=PathMapping([PathRule('a', 'x')])))
  flat = {('a',): (jnp.zeros(2), Annotation()), ('b',): (jnp.zeros(2), Annotation())}
  with pytest.raises(PathMappingError) as info:
    conversion.add_collections({'params': flat}, 'linen', 'nnx', target_paths=lambda: [('x',), ('y',)])
  assert 'b' in info.value.paths
  assert 'y' in info.value.paths and 'x' not in info.value.paths


def test_a_relaid_leaf_is_pending_until_run_and_kept_leaves_are_the_inputs():
  a, b = jnp.ones(3), jnp.zeros(3)
  conversion = Conversion(Options(paths=LAYERS, scan=True))
  (path, (value, _)), = conversion.add(layers(a, b), 'linen', 'nnx').items()
  assert isinstance(value, Pending) and value.shape == (2, 3)
  conversion.run()
  assert jnp.array_equal(conversion.value(value), jnp.stack([a, b]))
  kept = Conversion(Options(paths=LAYERS)).add(layers(a, b), 'linen', 'nnx')
  assert {id(v) for v, _ in kept.values()} == {id(a), id(b)}


def test_donated_sources_are_deleted_unless_another_leaf_shares_them():
  a, b = jnp.ones(3), jnp.zeros(3)
  conversion = Conversion(Options(paths=LAYERS, scan=True, donate=True))
  conversion.add(layers(a, b), 'linen', 'nnx')
  conversion.run()
  assert a.is_deleted() and b.is_deleted()

  tied = jnp.ones(3)
  conversion = Conversion(Options(paths=LAYERS, scan=True, donate=True))
  conversion.add(layers(tied, tied), 'linen', 'nnx')
  conversion.run()
  assert not tied.is_deleted()


def test_a_refusal_late_in_the_input_leaves_every_array_whole():
  a, b = jnp.ones(3), jnp.zeros(3)
  conversion = Conversion(Options(paths=LAYERS, scan=True, donate=True))
  conversion.add(layers(a, b), 'linen', 'nnx')
  gap = {('Block_0', 'w'): (jnp.ones(3), Annotation()), ('Block_2', 'w'): (jnp.ones(3), Annotation())}
  with pytest.raises(StructureError, match='missing layers'):
    conversion.add(gap, 'linen', 'nnx')
  assert not a.is_deleted() and not b.is_deleted()
