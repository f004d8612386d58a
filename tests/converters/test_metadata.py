"""Tests of `converters.metadata`: reading, writing and resolving annotations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from converters import metadata as md
from converters.errors import AnnotationError
from kit_mlp.description import FSDP_RULES, GUIDE_RULES, ModelDescription


NAMES = ('model', None)
# How code written for older Flax spells an NNX annotation, run on this Flax.
# Most spellings are renamed to `out_sharding` when the Variable is made;
# `Variable.replace` keeps the legacy key as it is.
LEGACY_SPELLINGS = {
    'Param(sharding=...)': lambda v: nnx.Param(v, sharding=NAMES),
    'Param(sharding_names=...)': lambda v: nnx.Param(v, sharding_names=NAMES),
    'with_metadata(sharding_names=...)': lambda v: nnx.Linear(
        8, 4, use_bias=False, rngs=nnx.Rngs(0),
        kernel_init=nnx.with_metadata(nnx.initializers.zeros, sharding_names=NAMES),
    ).kernel,
    "set_metadata('sharding', ...)": lambda v: _set(nnx.Param(v), 'sharding'),
    'replace(sharding=...)': lambda v: nnx.Param(v).replace(sharding=NAMES),
    'replace(sharding_names=...)': lambda v: nnx.Param(v).replace(sharding_names=NAMES),
}


# The key each spelling leaves on the Variable: only these reach the legacy branch.
KEPT_LEGACY_KEY = {'replace(sharding=...)': 'sharding', 'replace(sharding_names=...)': 'sharding_names'}


def _set(var, key):
  var.set_metadata(key, NAMES)
  return var


@pytest.fixture(scope='module')
def mesh():
  return ModelDescription(mesh_shape=(2, 4)).make_mesh()


@pytest.mark.filterwarnings('ignore::DeprecationWarning')
@pytest.mark.parametrize('spelling', LEGACY_SPELLINGS)
def test_legacy_nnx_spellings_read_as_the_annotation(mesh, spelling):
  with jax.set_mesh(mesh):
    var = LEGACY_SPELLINGS[spelling](jnp.zeros((4, 8)))
    value, annotation = md.read_nnx(var, 'w')
  keys = set(var.get_metadata()) & {'out_sharding', 'sharding', 'sharding_names'}
  assert keys == {KEPT_LEGACY_KEY.get(spelling, 'out_sharding')}
  assert annotation.names == NAMES and not annotation.logical
  assert dict(annotation.extra) == {}  # the legacy key is not carried twice
  box = md.write_linen(value, annotation)
  assert type(box) is nn.Partitioned and box.names == NAMES and box.value is value


@pytest.mark.filterwarnings('ignore::DeprecationWarning')
def test_legacy_key_disagreeing_with_out_sharding_is_an_error(mesh):
  with jax.set_mesh(mesh):
    var = nnx.Param(jnp.zeros((4, 8)), out_sharding=(None, 'model')).replace(sharding=NAMES)
  assert var.get_metadata()['out_sharding'] == (None, 'model')  # both keys, as Flax keeps them
  with pytest.raises(AnnotationError, match='w: out_sharding=.*legacy sharding'):
    md.read_nnx(var, 'w')


def test_linen_boxes_round_trip_through_the_neutral_form():
  rules = GUIDE_RULES
  for box in (
      nn.Partitioned(jnp.zeros((4, 8)), (None, 'model')),
      nn.LogicallyPartitioned(jnp.zeros((4, 8)), ('embed', 'hidden'), rules=rules),
      nn.LogicallyPartitioned(jnp.zeros((4, 8)), ('embed', 'hidden')),
  ):
    value, annotation = md.read_linen(box, 'w')
    again = md.write_linen(value, annotation)
    assert type(again) is type(box)
    assert again.names == box.names and getattr(again, 'rules', None) == getattr(box, 'rules', None)
    assert again.value is box.value


def test_nnx_metadata_with_no_linen_field_travels_in_a_carrying_box():
  var = nnx.Param(jnp.zeros((4, 8)), out_sharding=('embed', 'hidden'), sharding_rules=FSDP_RULES,
                  eager_sharding=False, note='kept')
  value, annotation = md.read_nnx(var, 'w')
  box = md.write_linen(value, annotation)
  assert isinstance(box, nn.LogicallyPartitioned)
  assert dict(box.extra) == {'eager_sharding': False, 'note': 'kept'}
  again = md.write_nnx(nnx.Param, *md.read_linen(box, 'w'))
  assert again.get_metadata() == var.get_metadata()


def test_nnx_metadata_of_an_unpartitioned_parameter_travels_in_a_box_too():
  var = nnx.Param(jnp.zeros((4, 8)), eager_sharding=False, note='kept')
  value, annotation = md.read_nnx(var, 'w')
  box = md.write_linen(value, annotation)
  assert isinstance(box, md.Annotated) and box.unbox() is value
  assert dict(box.extra) == {'eager_sharding': False, 'note': 'kept'}
  again = md.write_nnx(nnx.Param, *md.read_linen(box, 'w'))
  assert again.get_metadata() == var.get_metadata()


@pytest.mark.parametrize(
    'annotation, shape, message',
    [
        (md.Annotation(names=('model', None, None)), (4, 8), '3 sharding names .* give at most one'),
        (md.Annotation(names=('embed', 'x'), rules=GUIDE_RULES, logical=True), (4, 8), "logical names \\['x'\\] have no rule"),
        (md.Annotation(names=('pipe', None)), (4, 8), "mesh axes \\['pipe'\\]"),
        (md.Annotation(names=(None, 'model')), (4, 6), 'dimension 1 of size 6 is not divisible'),
        (md.Annotation(names=('batch', 'embed'), rules=FSDP_RULES, logical=True), (8, 8), "mesh axes \\['data'\\] on more than one"),
    ],
)
def test_resolve_rejects_what_linen_and_nnx_would_read_differently(annotation, shape, message):
  mesh = ModelDescription().make_mesh()
  with pytest.raises(AnnotationError, match=message):
    md.resolve(annotation, shape, mesh, 'w')


def test_layer_axis_is_inserted_and_removed_like_the_transforms():
  a = md.Annotation(names=(None, 'model'))
  stacked = md.add_layer_axis(a, 'layer')
  assert stacked.names == ('layer', None, 'model')
  assert md.remove_layer_axis(stacked, 'w') == (a, 'layer')
  assert md.add_layer_axis(a, None).names == (None, None, 'model')
  # The same as nn.scan's metadata_params does to a Partitioned box.
  box = nn.Partitioned(jnp.zeros((4, 8)), (None, 'model'))
  assert box.add_axis(0, {nn.PARTITION_NAME: 'layer'}).names == stacked.names


def test_a_box_mesh_is_carried_both_ways():
  mesh = ModelDescription().make_mesh()
  box = nn.Partitioned(jnp.zeros((4, 8)), (None, 'model'), mesh=mesh)
  var = md.write_nnx(nnx.Param, *md.read_linen(box, 'w'))
  assert var.get_metadata()['mesh'] is mesh
  again = md.write_linen(*md.read_nnx(var, 'w'))
  assert again.mesh is mesh and again.names == box.names


def test_fewer_names_than_dimensions_leave_the_trailing_ones_replicated():
  mesh = ModelDescription().make_mesh()
  a = md.Annotation(names=('embed', 'heads'), rules=(('embed', None), ('heads', 'model')), logical=True)
  assert md.resolve(a, (16, 4, 8), mesh, 'kernel') == jax.sharding.PartitionSpec(None, 'model', None)
  with pytest.raises(AnnotationError, match='kernel: dimension 1 of size 3 is not divisible'):
    md.resolve(a, (16, 3, 8), mesh, 'kernel')


RULES = (('embed', None), ('heads', 'model'))


@pytest.mark.parametrize(
    'annotation, rules, logical',
    [
        (md.Annotation(names=('embed', 'heads')), RULES, True),  # NNX under context rules
        (md.Annotation(names=(None, 'model')), RULES, False),  # mesh axes stay mesh axes
        (md.Annotation(names=('embed', 'heads')), None, False),  # no rules: read as mesh axes
        (md.Annotation(names=(('data', 'model'), None)), (('data', 'x'),), False),  # a tuple is mesh axes
        (md.Annotation(names=('embed', 'heads'), rules=RULES, logical=True), (), True),
    ],
)
def test_nnx_names_without_rules_are_read_as_nnx_reads_them_under_the_rules(annotation, rules, logical):
  read = md.as_logical(annotation, rules, 'w')
  assert read.logical is logical
  assert (read.names, read.rules) == (annotation.names, annotation.rules)


def test_nnx_names_mixing_ruled_and_unruled_are_refused_naming_the_path():
  with pytest.raises(AnnotationError, match=r"w: names \('embed', 'model'\) mix logical names \['embed'\] .* \['model'\]"):
    md.as_logical(md.Annotation(names=('embed', 'model')), RULES, 'w')
