"""Tests of `converters.description`: valid descriptions, and rejected ones."""

from __future__ import annotations

import jax
import pytest
from hypothesis import given, strategies as st

from converters.description import (
    FSDP_RULES,
    GUIDE_RULES,
    InvalidDescriptionError,
    ModelDescription,
)


@pytest.mark.parametrize(
    'fields, message',
    [
        (dict(num_layers=0), 'num_layers=0: set num_layers to 1 or more'),
        (dict(depth=30, mesh_shape=(2, 4)), 'depth=30 is not divisible by the \'model\''),
        (dict(batch=6, mesh_shape=(4, 2)), 'batch=6 is not divisible by the \'data\''),
        (
            dict(annotation='logical', rules=GUIDE_RULES[:-1] + (('layer', 'pipe'),)),
            "names mesh axis 'pipe', which the mesh",
        ),
        (
            dict(annotation='logical', rules=FSDP_RULES, depth=36, mesh_shape=(8, 1)),
            'depth=36 is not divisible by the \'data\' mesh axis of size 8',
        ),
        (
            dict(annotation='logical', rules=GUIDE_RULES[:2]),
            "logical name 'embed' has no rule; add ('embed', None)",
        ),
        (
            dict(annotation='logical', rules=GUIDE_RULES + (('embed', 'data'),)),
            "'embed' has more than one rule",
        ),
        (dict(use_scan=False, layer_partition='layer'), 'only applies to scanned'),
        (dict(use_scan=True, layer_partition='layer'), 'is not a mesh axis'),
        (
            dict(use_scan=True, layer_partition='data', num_layers=3),
            'num_layers=3 is not divisible by the \'data\'',
        ),
        (
            dict(use_scan=True, layer_partition='model'),
            "puts mesh axis 'model' on two dimensions",
        ),
        (
            dict(annotation='logical', rules=(('batch', 'data'), ('hidden', 'data'), ('embed', 'data'), ('layer', None))),
            "puts mesh axis 'data' on two dimensions",
        ),
        (dict(annotation='axes'), "annotation='axes'"),
        (dict(dtype='float16'), "dtype='float16'"),
        (dict(mesh_shape=(2, 0)), 'mesh_shape=(2, 0)'),
        (dict(depth=64.0), 'depth must be an int'),
    ],
)
def test_invalid_descriptions_say_what_to_change(fields, message):
  with pytest.raises(InvalidDescriptionError, match=None) as info:
    ModelDescription(**fields)
  assert message in str(info.value)


@pytest.mark.parametrize('rules', [GUIDE_RULES, FSDP_RULES])
@pytest.mark.parametrize('mesh_shape', [(2, 4), (1, 8), (8, 1), (4, 2)])
def test_valid_descriptions_build_an_auto_mesh(rules, mesh_shape):
  desc = ModelDescription(
      depth=64, annotation='logical', rules=rules, mesh_shape=mesh_shape,
      use_scan=True, layer_partition='layer',
  )
  mesh = desc.make_mesh()
  assert mesh.axis_names == ('data', 'model')
  assert dict(mesh.shape) == {'data': mesh_shape[0], 'model': mesh_shape[1]}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_too_few_devices_says_how_to_get_more():
  desc = ModelDescription(mesh_shape=(2, 4))
  with pytest.raises(InvalidDescriptionError, match='xla_force_host_platform'):
    desc.make_mesh(jax.devices()[:4])


def test_fsdp_rules_shard_embed_over_data():
  desc = ModelDescription(annotation='logical', rules=FSDP_RULES)
  assert desc.mesh_axis('embed') == 'data'
  assert ModelDescription(annotation='logical').mesh_axis('embed') is None


@given(
    num_layers=st.integers(-1, 6),
    depth=st.integers(1, 96),
    batch=st.integers(1, 16),
    use_scan=st.booleans(),
    layer_partition=st.sampled_from([None, 'layer', 'data', 'model']),
    annotation=st.sampled_from(['device', 'logical']),
    rules=st.sampled_from([GUIDE_RULES, FSDP_RULES]),
    mesh_shape=st.sampled_from([(1, 8), (2, 4), (4, 2), (8, 1)]),
)
def test_a_description_is_either_rejected_or_fully_divisible(**fields):
  try:
    desc = ModelDescription(**fields)
  except InvalidDescriptionError as e:
    assert str(e)  # always says what to change
    return
  sizes = dict(zip(('data', 'model'), desc.mesh_shape))
  axes = desc.axes
  for name in axes.kernel + axes.w2:
    if (axis := desc.mesh_axis(name)) is not None:
      assert desc.depth % sizes[axis] == 0
  assert desc.batch % sizes[desc.mesh_axis(axes.output[0])] == 0
  if desc.use_scan and desc.layer_partition is not None:
    if (axis := desc.mesh_axis(desc.layer_partition)) is not None:
      assert desc.num_layers % sizes[axis] == 0
  assert desc.num_layers >= 1
