"""Tests of `kit_mlp.description`: valid descriptions, and rejected ones."""

from __future__ import annotations

import re

import jax
import pytest
from hypothesis import event, example, given, settings, strategies as st
from jax.sharding import PartitionSpec as P

from kit_mlp.data import batch_sharding
from kit_mlp.description import (
    FSDP_RULES,
    GUIDE_RULES,
    InvalidDescriptionError,
    ModelDescription,
)
from tests.kit_mlp.strategies import random_rule_sets
from tests.helpers import EMBED_FIRST_FSDP_RULES, expected_axes, resolve_like_linen


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


def first_problem(num_layers, depth, batch, use_scan, layer_partition, annotation, rules, mesh_shape):
  """What validation must say first about these fields, or None if they are
  valid: written out from the annotations of the guides, not from the code."""
  sizes = dict(zip(('data', 'model'), mesh_shape))
  logical = annotation == 'logical'
  if num_layers < 1:
    return f'num_layers={num_layers}: set num_layers to 1 or more'
  if not use_scan and layer_partition is not None:
    return 'only applies to scanned layers: set use_scan=True or layer_partition=None'
  if not logical and layer_partition not in (None, 'data', 'model'):
    return f'layer_partition={layer_partition!r} is not a mesh axis'
  if logical and layer_partition in ('data', 'model'):  # no rule names them
    return f"rules: logical name {layer_partition!r} has no rule; add ({layer_partition!r}, None)"
  table = dict(rules)
  axis = (lambda n: table.get(n)) if logical else (lambda n: n)
  layer = axis(layer_partition) if use_scan and layer_partition else None
  kernel = ('embed', 'hidden') if logical else (None, 'model')
  if layer is not None and layer in map(axis, kernel):
    return f'puts mesh axis {layer!r} on two dimensions'
  for name in kernel:  # W2 has the same names, swapped
    if axis(name) is not None and depth % sizes[axis(name)]:
      return f'change depth to a multiple of {sizes[axis(name)]}'
  # The batch dimension follows the output activation's ('batch', 'embed').
  batch_axis = resolve_like_linen(('batch', 'embed'), rules)[0] if logical else 'data'
  if batch_axis is not None and batch % sizes[batch_axis]:
    return f"batch={batch} is not divisible by the {batch_axis!r} mesh axis"
  if layer is not None and num_layers % sizes[layer]:
    return f'change num_layers to a multiple of {sizes[layer]}'
  return None


@given(
    num_layers=st.integers(-1, 6),
    depth=st.integers(1, 96),
    batch=st.integers(1, 16),
    use_scan=st.booleans(),
    layer_partition=st.sampled_from([None, 'layer', 'data', 'model']),
    annotation=st.sampled_from(['device', 'logical']),
    # The guides' rules, FSDP rules in both orders, and rules that shard layers.
    rules=st.one_of(st.sampled_from([GUIDE_RULES, FSDP_RULES, EMBED_FIRST_FSDP_RULES]), random_rule_sets()),
    mesh_shape=st.sampled_from([(1, 8), (2, 4), (4, 2), (8, 1)]),
)
@settings(max_examples=300)  # no compilation: cheap enough to cover every rejection
# Rare draws, pinned: a sharded layer axis the layer count does not divide, and
# a batch 'data' does not divide, valid because 'embed' takes 'data' first.
@example(num_layers=3, depth=8, batch=8, use_scan=True, layer_partition='layer', annotation='logical',
         rules=(('layer', 'data'), ('batch', None), ('embed', None), ('hidden', 'model')), mesh_shape=(2, 4))
@example(num_layers=2, depth=8, batch=3, use_scan=False, layer_partition=None, annotation='logical',
         rules=EMBED_FIRST_FSDP_RULES, mesh_shape=(2, 4))
def test_a_description_is_rejected_exactly_when_invalid_saying_what_to_change(**fields):
  expected = first_problem(**fields)
  event('valid' if expected is None else 'rejected: ' + re.sub(r'\d+', 'N', expected)[:48])
  if expected is not None:
    with pytest.raises(InvalidDescriptionError) as info:
      ModelDescription(**fields)
    assert expected in str(info.value)
    return
  desc = ModelDescription(**fields)
  sizes = dict(zip(('data', 'model'), desc.mesh_shape))
  axes = desc.axes
  for name in axes.kernel + axes.w2:
    if (axis := desc.mesh_axis(name)) is not None:
      assert desc.depth % sizes[axis] == 0
  if (axis := expected_axes(desc, axes.output)[0]) is not None:
    assert desc.batch % sizes[axis] == 0
  if desc.use_scan and desc.layer_partition is not None:
    if (axis := desc.mesh_axis(desc.layer_partition)) is not None:
      assert desc.num_layers % sizes[axis] == 0


@pytest.mark.parametrize('names, rules, resolved', [
    (('batch', 'embed'), FSDP_RULES, ('data', None)),
    # Not "the earlier dimension wins": the rule listed first does.
    (('embed', 'batch'), FSDP_RULES, (None, 'data')),
    (('batch', 'embed'), EMBED_FIRST_FSDP_RULES, (None, 'data')),
    (('batch', 'hidden'), FSDP_RULES, ('data', 'model')),
])
def test_the_first_rule_to_claim_a_free_mesh_axis_wins(names, rules, resolved):
  desc = ModelDescription(annotation='logical', rules=rules)
  assert desc.resolve(names) == resolved
  assert resolve_like_linen(names, rules) == resolved  # the tests' own reading of Linen


def test_batches_are_sharded_as_the_output_activations():
  for rules, spec in ((FSDP_RULES, P('data', None)), (EMBED_FIRST_FSDP_RULES, P(None, 'data'))):
    desc = ModelDescription(annotation='logical', rules=rules, mesh_shape=(2, 4))
    assert batch_sharding(desc, desc.make_mesh()).spec == spec
    assert batch_sharding(desc, desc.make_mesh(), stacked=True).spec == P(None, *spec)
