"""`converters.sharding`: which mesh a leaf lives on, inputs placed where their
annotations say, the sharding each target asks for, scalars replicated."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from converters import metadata as md
from converters import relayout_ops, sharding
from converters.errors import AnnotationError, LayoutError
from converters.planning import Target
from tests.helpers import mesh

MODEL = md.Annotation(names=(None, 'model'))


def test_a_leaf_lives_on_its_arrays_mesh_else_its_annotations_else_the_given_one():
  on_mesh = jax.device_put(np.ones((4, 8), np.float32), NamedSharding(mesh(), P()))
  other = mesh((4, 2))
  assert sharding.mesh_of(on_mesh) is mesh() and sharding.mesh_of(np.ones(3)) is None
  assert sharding.leaf_mesh(on_mesh, md.Annotation(mesh=other), None) is mesh()
  assert sharding.leaf_mesh(np.ones(3), md.Annotation(mesh=other), mesh()) is other
  assert sharding.leaf_mesh(np.ones(3), md.Annotation(), mesh()) is mesh()
  assert sharding.mesh_of_tree({('a',): (np.ones(3), None), ('b',): (on_mesh, None)}) is mesh()


def test_the_placement_mesh_is_the_given_one_else_the_enclosing_set_mesh():
  assert sharding.placement_mesh(None) is None
  with jax.set_mesh(mesh()):
    assert sharding.placement_mesh(None) == mesh()
    assert sharding.placement_mesh(mesh((4, 2))) == mesh((4, 2))


def test_inputs_go_where_their_annotations_say_and_those_in_place_are_kept():
  placed = jax.device_put(np.ones((4, 8), np.float32), NamedSharding(mesh(), P(None, 'model')))
  host = np.ones((4, 8), np.float32)
  out = sharding.place_inputs({('kept',): (placed, MODEL), ('host',): (host, MODEL)}, mesh(), None)
  assert out[('kept',)][0] is placed  # no copy
  assert out[('host',)][0].sharding.is_equivalent_to(NamedSharding(mesh(), P(None, 'model')), 2)
  with pytest.raises(AnnotationError, match='lie on no mesh and none is given: host'):
    sharding.place_inputs({('host',): (host, MODEL)}, None, None)
  assert sharding.place_inputs({('host',): (host, MODEL)}, None, None, unplaced_stay=True)[('host',)][0] is host


def test_a_target_takes_its_annotation_on_the_mesh_its_sources_share():
  a = jax.device_put(np.ones((4, 8), np.float32), NamedSharding(mesh(), P()))
  b = jax.device_put(np.ones((4, 8), np.float32), NamedSharding(mesh((4, 2)), P()))
  target = Target(relayout_ops.Keep(), (('a',),), MODEL, (4, 8), jnp.float32)
  (got,) = sharding.target_shardings({('t',): target}, {('a',): (a, md.Annotation())}).values()
  assert got == NamedSharding(mesh(), P(None, 'model'))
  stack = Target(relayout_ops.Stack(), (('a',), ('b',)), MODEL, (2, 4, 8), jnp.float32)
  flat = {('a',): (a, md.Annotation()), ('b',): (b, md.Annotation())}
  with pytest.raises(LayoutError, match='its sources live on different meshes'):
    sharding.target_shardings({('t',): stack}, flat)
  # No mesh anywhere: no sharding to ask for.
  assert sharding.target_shardings({('t',): target}, {('a',): (np.ones((4, 8)), md.Annotation())}) == {('t',): None}


def test_a_scalar_is_kept_or_placed_replicated():
  step = jnp.asarray(3, jnp.int32)
  assert sharding.place_scalar(step, mesh()) is step
  placed = sharding.place_scalar(np.int32(3), mesh())
  assert placed.sharding == NamedSharding(mesh(), P()) and int(placed) == 3
  assert sharding.place_scalar(np.int32(3), None).shape == ()


def test_linen_resolves_its_own_boxes_logical_ones_by_their_rules():
  from flax import linen as nn

  value = np.ones((4, 8), np.float32)
  assert sharding.linen_sharding(mesh(), (), nn.Partitioned(value, (None, 'model'))) == NamedSharding(
      mesh(), P(None, 'model'))
  logical = nn.LogicallyPartitioned(value, ('embed', 'mlp'), rules=(('embed', None), ('mlp', 'model')))
  assert sharding.linen_sharding(mesh(), (), logical).spec == P(None, 'model')
  ruled = nn.LogicallyPartitioned(value, ('embed', 'mlp'))
  assert sharding.linen_sharding(mesh(), (('mlp', 'data'),), ruled).spec == P(None, 'data')
  assert sharding.linen_sharding(mesh(), (), value) == NamedSharding(mesh(), P())
