"""The catalogue of bad inputs: each raises its `ConversionError`, naming the path.

Every case also checks that the input was left exactly as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import flax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import converters
from converters import errors
from converters.paths import PathRule
from converters.transforms import Rearrange
from converters.presets import KIT_PATHS
from kit_mlp.description import FSDP_RULES
from tests.converters.conversion_cases import (
    description,
    linen_trained,
    linen_trainer,
    nnx_abstract,
    nnx_trained,
)


def params_of(desc):
  return dict(linen_trained(desc, 'adam', 0).params)


def with_leaf(tree, path, leaf):
  """A shallow copy of nested dicts with `path` set to `leaf` (None deletes)."""
  tree = dict(tree)
  if len(path) == 1:
    if leaf is None:
      del tree[path[0]]
    else:
      tree[path[0]] = leaf
    return tree
  tree[path[0]] = with_leaf(tree.get(path[0], {}), path[1:], leaf)
  return tree


LOOP = description('device', False)
SCAN = description('device', True)
LOGICAL = description('logical', False)
KERNEL = ('DotReluDot_1', 'Dense_0', 'kernel')


def box(desc, path=KERNEL):
  node = params_of(desc)
  for key in path:
    node = node[key]
  return node


def case_missing_param():
  state = linen_trained(LOOP, 'adam', 0)
  state = state.replace(params=with_leaf(state.params, ('DotReluDot_2', 'W2'), None))
  return dict(linen=state, target=nnx_abstract(LOOP, 'adam'))


def case_extra_layer():
  params = params_of(LOOP)
  params['DotReluDot_3'] = params['DotReluDot_0']
  return dict(linen={'params': params}, target=nnx_abstract(LOOP, 'adam')[0])


def case_unmapped_param():
  params = with_leaf(params_of(LOOP), ('DotReluDot_0', 'bias'), nn.Partitioned(jnp.zeros((64,)), ('model',)))
  params = with_leaf(params, ('head', 'kernel'), nn.Partitioned(jnp.zeros((64, 64)), (None, None)))
  return dict(linen={'params': params})


def case_shape_mismatch():
  b = box(LOOP)
  bad = b.replace(value=jax.device_put(b.value[:, :32], b.value.sharding))
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, bad)}, target=nnx_abstract(LOOP, 'adam')[0])


def case_dtype_mismatch():
  b = box(LOOP)
  bad = b.replace(value=b.value.astype(jnp.bfloat16))
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, bad)}, target=nnx_abstract(LOOP, 'adam')[0])


def case_target_of_another_depth():
  # Every kernel and both moments of each differ: all listed, not the first.
  return dict(linen=linen_trained(LOOP, 'adam', 0), target=nnx_abstract(dataclasses.replace(LOOP, depth=32), 'adam'))


def case_rule_to_a_path_the_target_lacks():
  rules = [r for r in KIT_PATHS.rules if r.linen != 'DotReluDot_{i}/W2']
  rules.append(PathRule('DotReluDot_{i}/W2', 'layers/{i}/w_2', 'ScanDotReluDot_0/W2', 'layers/w_2'))
  return dict(linen={'params': params_of(LOOP)}, target=nnx_abstract(LOOP, 'adam')[0], paths=converters.PathMapping(rules))


def case_rule_missing_on_both_sides():
  rules = [r for r in KIT_PATHS.rules if r.linen != 'DotReluDot_{i}/W2']
  return dict(linen={'params': params_of(LOOP)}, target=nnx_abstract(LOOP, 'adam')[0], paths=converters.PathMapping(rules))


def case_names_rank():
  bad = box(LOOP).replace(names=(None, 'model', None))
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, bad)})


def case_logical_name_without_rule():
  bad = box(LOGICAL).replace(names=('embed', 'mlp'))
  return dict(linen={'params': with_leaf(params_of(LOGICAL), KERNEL, bad)})


def case_mesh_axis_missing():
  bad = box(LOOP).replace(names=(None, 'tensor'))
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, bad)})


def case_indivisible_dimension():
  b = box(LOOP)
  bad = b.replace(value=jnp.zeros((64, 6)), names=(None, 'model'))
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, bad)}, mesh=LOOP.make_mesh())


def case_stacked_length_differs_from_num_layers():
  return dict(linen={'params': params_of(SCAN)}, scan=False, num_layers=4)


def case_mixed_boxed_and_bare():
  bare = box(LOOP).value
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, bare)}, strict=True)


def case_unknown_optimizer_state():
  state = linen_trained(LOOP, 'adam', 0)
  return dict(linen=state, target=nnx_abstract(LOOP, 'sgd_momentum'))


def case_ema_count_differs_from_step():
  state = linen_trained(LOOP, 'fsdp_sgd', 1)
  ema_state = state.opt_state[0]
  state = state.replace(opt_state=(ema_state._replace(count=ema_state.count + 5),) + state.opt_state[1:])
  return dict(linen=state, target=nnx_abstract(LOOP, 'fsdp_sgd'))


def case_mapping_collision():
  rules = [
      PathRule('DotReluDot_{i}/Dense_0/kernel', 'layers/{i}/w'),
      PathRule('DotReluDot_0/W2', 'layers/1/w'),
      PathRule('DotReluDot_1/W2', 'w2/1'),
      PathRule('DotReluDot_2/W2', 'w2/2'),
  ]
  return dict(linen={'params': params_of(LOOP)}, paths=converters.PathMapping(rules))


def case_ambiguous_rules():
  rules = list(KIT_PATHS.rules) + [PathRule('DotReluDot_2/W2', 'extra/w2')]
  return dict(linen={'params': params_of(LOOP)}, paths=converters.PathMapping(rules))


def case_unknown_box_type():
  class MyBox(nn.Partitioned):
    pass

  b = box(LOOP)
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, MyBox(b.value, b.names))})


def case_not_a_linen_tree():
  return dict(linen=[1, 2, 3])


def case_train_state_without_optimizer_target():
  return dict(linen=linen_trained(LOOP, 'adam', 0), target=nnx_abstract(LOOP, 'adam')[0])


def case_target_on_another_mesh():
  other = description('device', False, mesh_shape=(8, 1))
  return dict(linen={'params': params_of(LOOP)}, target=nnx_abstract(other, 'adam')[0])


def case_array_placed_against_its_annotation():
  b = box(LOOP)
  moved = jax.device_put(b.value, NamedSharding(b.value.sharding.mesh, P('model', None)))
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, b.replace(value=moved))})


def case_num_layers_with_the_looped_layout_kept():
  return dict(linen={'params': params_of(LOOP)}, num_layers=4)


def case_num_layers_with_the_stacked_layout_kept():
  return dict(linen={'params': params_of(SCAN)}, num_layers=2)


def case_target_path_nested_in_another():
  rules = list(KIT_PATHS.rules) + [PathRule('head/kernel', 'layers/0/w2/extra')]
  params = with_leaf(params_of(LOOP), ('head', 'kernel'), box(LOOP, ('DotReluDot_0', 'W2')))
  return dict(linen={'params': params}, paths=rules)


def case_layers_on_different_device_orders():
  params = params_of(LOOP)
  b = box(LOOP, ('DotReluDot_1', 'W2'))
  mesh = b.value.sharding.mesh
  reversed_mesh = Mesh(mesh.devices[::-1, ::-1], mesh.axis_names, axis_types=mesh.axis_types)
  moved = jax.device_put(b.value, NamedSharding(reversed_mesh, b.value.sharding.spec))
  return dict(linen={'params': with_leaf(params, ('DotReluDot_1', 'W2'), b.replace(value=moved))}, scan=True)


def case_float_parameter():
  return dict(linen={'params': with_leaf(params_of(LOOP), ('DotReluDot_0', 'W2'), 0.5)})


def case_string_parameter():
  return dict(linen={'params': with_leaf(params_of(LOOP), ('DotReluDot_0', 'W2'), 'weights.npy')})


def case_none_parameter():
  params = params_of(LOOP)
  params['DotReluDot_0'] = dict(params['DotReluDot_0'], W2=None)
  return dict(linen={'params': params})


def case_num_layers_as_a_string():
  return dict(linen={'params': params_of(SCAN)}, scan=False, num_layers='2')


def case_paths_that_are_not_rules():
  return dict(linen={'params': params_of(LOOP)}, paths=['DotReluDot_{i}/W2'])


def case_empty_params():
  return dict(linen={'params': {}})


def case_slash_in_a_key_collides_with_nesting():
  w2 = box(LOOP, ('DotReluDot_0', 'W2'))
  rules = [PathRule('a/b', 'x')]
  return dict(linen={'params': {'a/b': w2, 'a': {'b': w2}}}, paths=rules)


def case_deleted_input_array():
  params = jax.tree.map(jnp.copy, params_of(LOOP))
  params['DotReluDot_2']['W2'].value.delete()
  return dict(linen={'params': params}, scan=True, donate=True)


def case_layer_on_one_device():
  b = box(LOOP, ('DotReluDot_1', 'W2'))
  one = jax.device_put(b.value, jax.devices()[5])
  return dict(linen={'params': with_leaf(params_of(LOOP), ('DotReluDot_1', 'W2'), b.replace(value=one))}, scan=True)


def case_abstract_and_real_layers_mixed():
  b = box(LOOP, ('DotReluDot_1', 'W2'))
  abstract = jax.ShapeDtypeStruct(b.value.shape, b.value.dtype)
  return dict(linen={'params': with_leaf(params_of(LOOP), ('DotReluDot_1', 'W2'), b.replace(value=abstract))}, scan=True)


def case_metadata_nnx_refuses():
  from converters.metadata import CarryingPartitioned

  b = box(LOOP)
  carrying = CarryingPartitioned(b.value, b.names, extra=(('value', 1),))
  return dict(linen={'params': with_leaf(params_of(LOOP), KERNEL, carrying)})


def case_rank_0_stacked_parameter():
  scalar = nn.Partitioned(jnp.zeros(()), ())
  return dict(linen={'params': with_leaf(params_of(SCAN), ('ScanDotReluDot_0', 'W2'), scalar)}, scan=False)


def case_float_step():
  state = linen_trained(LOOP, 'adam', 0)
  return dict(linen=state.replace(step=2.5), target=nnx_abstract(LOOP, 'adam'))


def case_step_out_of_range():
  state = linen_trained(LOOP, 'adam', 0)
  return dict(linen=state.replace(step=jnp.int32(-5)), target=nnx_abstract(LOOP, 'adam'))


def case_rules_with_a_list():
  bad = box(LOGICAL).replace(rules=(('embed', None), ('hidden', ['model'])))
  return dict(linen={'params': with_leaf(params_of(LOGICAL), KERNEL, bad)})


def case_target_with_other_annotations():
  # GUIDE_RULES read ('embed', 'hidden') as (None, 'model'), FSDP_RULES as ('data', 'model').
  fsdp = description('logical', False, rules=FSDP_RULES)
  return dict(linen={'params': params_of(LOGICAL)}, target=nnx_abstract(fsdp, 'adam')[0])


def case_moments_the_target_optimizer_lacks():
  return dict(linen=linen_trained(LOOP, 'adam', 0), target=nnx_abstract(LOOP, 'fsdp_sgd'))


def case_unknown_collection():
  return dict(linen={'params': params_of(LOOP), 'ema': params_of(LOOP)})


def case_intermediates():
  return dict(linen={'params': params_of(LOOP), 'intermediates': {'DotReluDot_0': {'__call__': (jnp.zeros(2),)}}})


def case_collection_of_another_variable_type_than_the_target():
  params = params_of(LOOP)
  w2 = params['DotReluDot_0']['W2']
  params = with_leaf(params, ('DotReluDot_0', 'W2'), None)
  return dict(
      linen={'params': params, 'batch_stats': {'DotReluDot_0': {'W2': w2}}},
      target=nnx_abstract(LOOP, 'adam')[0],
  )


def case_collections_colliding_in_nnx():
  w2 = params_of(LOOP)['DotReluDot_0']['W2']
  return dict(linen={'params': params_of(LOOP), 'batch_stats': {'DotReluDot_0': {'W2': w2}}})


def case_train_state_field_of_no_collection():
  @flax.struct.dataclass
  class WithKey(TrainState):
    dropout_key: jax.Array = None

  state = linen_trained(LOOP, 'adam', 0)
  with_key = WithKey(**{f.name: getattr(state, f.name) for f in dataclasses.fields(state)}, dropout_key=jnp.zeros(2))
  return dict(linen=with_key, target=nnx_abstract(LOOP, 'adam'))


def _with_rule(rule):
  """KIT_PATHS with the MLP's first kernel taken over by `rule`."""
  rules = [r for r in KIT_PATHS.rules if r.linen != 'DotReluDot_{i}/Dense_0/kernel']
  return converters.PathMapping(rules + [rule])


def case_transform_that_cannot_carry_the_sharding():
  # (E, hidden) named (None, 'model'): flattening puts the sharded axis behind E.
  rule = PathRule('DotReluDot_{i}/Dense_0/kernel', 'layers/{i}/dot1/kernel', transform=Rearrange('e h -> (e h)', e=64))
  return dict(linen={'params': params_of(LOOP)}, paths=_with_rule(rule))


def case_transform_split_the_mesh_cannot_divide():
  # hidden 64 over 'model' (4 devices) split into (2, 32): 2 heads over 4 devices.
  rule = PathRule('DotReluDot_{i}/Dense_0/kernel', 'layers/{i}/dot1/kernel', transform=Rearrange('e (h d) -> e h d', h=2))
  return dict(linen={'params': params_of(LOOP)}, paths=_with_rule(rule))


def case_transform_of_another_rank():
  rule = PathRule('DotReluDot_{i}/Dense_0/kernel', 'layers/{i}/dot1/kernel', transform=Rearrange('e h d -> e (h d)', h=2))
  return dict(linen={'params': params_of(LOOP)}, paths=_with_rule(rule))


def case_fused_part_missing():
  rule = PathRule(
      ('DotReluDot_{i}/Dense_0/kernel', 'DotReluDot_{i}/Dense_1/kernel'), 'layers/{i}/dot1/kernel',
      transform=Rearrange('e h -> e (two h)'),
  )
  return dict(linen={'params': params_of(LOOP)}, paths=_with_rule(rule))


def case_fused_parts_annotated_differently():
  # Dense_0/kernel is (None, 'model'), W2 ('model', None): one array cannot hold both.
  rules = [r for r in KIT_PATHS.rules if r.linen not in ('DotReluDot_{i}/Dense_0/kernel', 'DotReluDot_{i}/W2')]
  rule = PathRule(('DotReluDot_{i}/Dense_0/kernel', 'DotReluDot_{i}/W2'), 'layers/{i}/both', transform=Rearrange('a b -> two a b'))
  return dict(linen={'params': params_of(LOOP)}, paths=converters.PathMapping(rules + [rule]))


CATALOGUE = {
    'missing param': (case_missing_param, errors.StructureError, 'the source lacks [model/layers/2/w2'),
    'extra layer': (case_extra_layer, errors.StructureError, 'model/layers/3/w2'),
    'unmapped params': (case_unmapped_param, errors.PathMappingError, 'DotReluDot_0/bias, head/kernel'),
    'shape mismatch': (case_shape_mismatch, errors.ShapeError, 'model/layers/1/dot1/kernel: converted shape (64, 32)'),
    'target of another depth': (case_target_of_another_depth, errors.ShapeError, '18 leaves do not fit the target: model/layers/0/dot1/kernel: converted shape (64, 64), target expects (32, 32); model/layers/0/w2: converted shape'),
    'rule to a path the target lacks': (case_rule_to_a_path_the_target_lacks, errors.StructureError, "the source lacks [model/layers/0/w2 (no rule names it), model/layers/1/w2 (no rule names it), model/layers/2/w2 (no rule names it)] and has [model/layers/0/w_2 (rule 'DotReluDot_{i}/W2' <-> 'layers/{i}/w_2')"),
    'rule missing on both sides': (case_rule_missing_on_both_sides, errors.PathMappingError, 'no rule maps these linen paths: DotReluDot_0/W2, DotReluDot_1/W2, DotReluDot_2/W2; and no rule maps these nnx paths of the target: layers/0/w2, layers/1/w2, layers/2/w2; add a PathRule'),
    'dtype mismatch': (case_dtype_mismatch, errors.ShapeError, 'converted dtype bfloat16, target expects float32'),
    'len(names) > ndim': (case_names_rank, errors.AnnotationError, 'DotReluDot_1/Dense_0/kernel: 3 sharding names'),
    'logical name with no rule': (case_logical_name_without_rule, errors.AnnotationError, "logical names ['mlp'] have no rule"),
    'mesh axis the mesh lacks': (case_mesh_axis_missing, errors.AnnotationError, "mesh axes ['tensor']"),
    'indivisible dimension': (case_indivisible_dimension, errors.AnnotationError, 'dimension 1 of size 6 is not divisible'),
    'stacked length != num_layers': (case_stacked_length_differs_from_num_layers, errors.LayoutError, 'stacked axis has length 3, expected num_layers=4'),
    'mixed boxed and bare, strict': (case_mixed_boxed_and_bare, errors.AnnotationError, 'bare arrays: DotReluDot_1/Dense_0/kernel'),
    'unknown optimizer state': (case_unknown_optimizer_state, errors.OptimizerStateError, 'optimizer/opt_state/0/trace'),
    'ema count != step': (case_ema_count_differs_from_step, errors.OptimizerStateError, 'opt_state/0/count=6 differs from step=1'),
    'mapping collision': (case_mapping_collision, errors.PathMappingError, 'layers/1/w <- DotReluDot_0/W2 & DotReluDot_1/Dense_0/kernel'),
    'ambiguous rules': (case_ambiguous_rules, errors.PathMappingError, 'several rules map these linen paths: DotReluDot_2/W2'),
    'unknown box type': (case_unknown_box_type, errors.AnnotationError, 'box type MyBox'),
    'not a linen tree': (case_not_a_linen_tree, errors.StructureError, 'got list'),
    'TrainState, model-only target': (case_train_state_without_optimizer_target, errors.StructureError, 'target=(model, optimizer)'),
    'target on another mesh': (case_target_on_another_mesh, errors.LayoutError, "model/layers/0/dot1/kernel: the converted array lives on mesh {'data': 2, 'model': 4} on devices [0, 1, 2, 3, 4, 5, 6, 7] but the target is on mesh {'data': 8, 'model': 1}"),
    'array placed against its annotation': (case_array_placed_against_its_annotation, errors.AnnotationError, "DotReluDot_1/Dense_0/kernel is placed as P('model', None) but its names (None, 'model') ask for P(None, 'model')"),
    'num_layers, looped layout kept': (case_num_layers_with_the_looped_layout_kept, errors.StructureError, 'missing layers [DotReluDot_3/Dense_0/kernel]'),
    'num_layers, stacked layout kept': (case_num_layers_with_the_stacked_layout_kept, errors.LayoutError, 'ScanDotReluDot_0/W2: stacked axis has length 3, expected num_layers=2'),
    'target path nested in another': (case_target_path_nested_in_another, errors.PathMappingError, 'layers/0/w2/extra inside layers/0/w2'),
    'layers on different device orders': (case_layers_on_different_device_orders, errors.LayoutError, 'layers/w2: its sources live on different meshes or device orders (DotReluDot_0/W2 on'),
    'float parameter': (case_float_parameter, errors.StructureError, 'params/DotReluDot_0/W2: is a float, not an array'),
    'string parameter': (case_string_parameter, errors.StructureError, 'params/DotReluDot_0/W2: is a str, not an array'),
    'None parameter': (case_none_parameter, errors.StructureError, 'params/DotReluDot_0/W2: is None'),
    "num_layers='2'": (case_num_layers_as_a_string, errors.LayoutError, "num_layers='2': pass a non-negative int"),
    'paths that are not rules': (case_paths_that_are_not_rules, errors.PathMappingError, "paths holds 'DotReluDot_{i}/W2', which are not PathRules"),
    'empty params': (case_empty_params, errors.StructureError, 'params: holds no parameters'),
    "'a/b' key beside a/b nesting": (case_slash_in_a_key_collides_with_nesting, errors.PathMappingError, "no rule maps these linen paths: 'a/b'"),
    'deleted input array': (case_deleted_input_array, errors.StructureError, 'were deleted (donated to an earlier call?): DotReluDot_2/W2'),
    'layer on one device': (case_layer_on_one_device, errors.LayoutError, 'layers/w2: DotReluDot_1/W2 live on one device, not on the mesh'),
    'abstract and real layers mixed': (case_abstract_and_real_layers_mixed, errors.LayoutError, 'layers/w2: its sources mix arrays and jax.ShapeDtypeStruct'),
    'metadata NNX refuses': (case_metadata_nnx_refuses, errors.AnnotationError, "layers/1/dot1/kernel: its metadata {'value': 1} cannot be written"),
    'rank-0 stacked parameter': (case_rank_0_stacked_parameter, errors.LayoutError, 'ScanDotReluDot_0/W2: a stacked parameter of shape () has no layers'),
    'float step': (case_float_step, errors.ShapeError, 'optimizer/step: is 2.5 of dtype float'),
    'step out of range': (case_step_out_of_range, errors.ShapeError, 'optimizer/step: -5 does not fit the target'),
    'rules with a list': (case_rules_with_a_list, errors.AnnotationError, 'are not (name, mesh axis) pairs'),
    'target with other annotations': (case_target_with_other_annotations, errors.AnnotationError, "model/layers/0/dot1/kernel: converted annotation names=('embed', 'hidden') rules=(('batch', 'data'), ('hidden', 'model'), ('embed', None), ('layer', None)) resolves to P(None, 'model'), target has names=('embed', 'hidden')"),
    'moments the target optimizer lacks': (case_moments_the_target_optimizer_lacks, errors.OptimizerStateError, '0/mu'),
    'unknown collection': (case_unknown_collection, errors.StructureError, "ema: no NNX Variable type is known for the Linen collection 'ema'; pass collections={'ema': VariableType}"),
    'intermediates': (case_intermediates, errors.StructureError, "intermediates: the 'intermediates' collection holds values sown during one call"),
    'collection of another Variable type than the target': (case_collection_of_another_variable_type_than_the_target, errors.StructureError, "model/layers/0/w2: converted from the Linen 'batch_stats' collection (BatchStat Variables), but the target holds a ConstrainedParam there"),
    'collections colliding in NNX': (case_collections_colliding_in_nnx, errors.StructureError, 'layers/0/w2 (params and batch_stats)'),
    'transform that cannot carry the sharding': (case_transform_that_cannot_carry_the_sharding, errors.AnnotationError, "DotReluDot_0/Dense_0/kernel: Rearrange('e h -> (e h)', e=64) cannot carry the sharding of axis h (named 'model')"),
    'transform split the mesh cannot divide': (case_transform_split_the_mesh_cannot_divide, errors.AnnotationError, "layers/0/dot1/kernel: dimension 1 of size 2 is not divisible by mesh axis 'model' of size 4"),
    'transform of another rank': (case_transform_of_another_rank, errors.ShapeError, "DotReluDot_0/Dense_0/kernel: shape (64, 64) has 2 dimensions, the linen side of Rearrange('e h d -> e (h d)', h=2) has 3"),
    'fused part missing': (case_fused_part_missing, errors.StructureError, 'parts of fused parameters are missing: DotReluDot_0/Dense_1/kernel, DotReluDot_1/Dense_1/kernel, DotReluDot_2/Dense_1/kernel'),
    'fused parts annotated differently': (case_fused_parts_annotated_differently, errors.LayoutError, 'must share shape, dtype and annotation with DotReluDot_0/Dense_0/kernel (64, 64) float32: DotReluDot_0/W2 differ'),
    'TrainState field of no collection': (case_train_state_field_of_no_collection, errors.StructureError, 'TrainState.dropout_key: is not a collection, and NNX has no place for it; leave it out (state.replace(dropout_key=None))'),
}


def _fingerprint(x):
  """What an input leaf's value is: an array's identity, liveness and bytes."""
  if isinstance(x, jax.Array):
    if x.is_deleted():
      return ('deleted array', id(x))
    return ('array', id(x), x.shape, x.dtype, x.sharding, hashlib.sha256(np.asarray(x).tobytes()).hexdigest())
  if isinstance(x, jax.ShapeDtypeStruct):
    return ('abstract', x.shape, x.dtype, x.sharding)
  return ('other', type(x).__name__, repr(x))


def snapshot(*trees):
  """Every leaf of the inputs: path, the object, its metadata and its value."""
  is_leaf = lambda x: isinstance(x, (nn.Partitioned, nnx.Variable))
  records = []
  for tree in trees:
    for path, x in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]:
      if isinstance(x, nnx.Variable):
        meta, value = x.get_metadata(), x.get_value()
      elif isinstance(x, nn.Partitioned):
        meta, value = {k: v for k, v in vars(x).items() if k != 'value'}, x.value
      else:
        meta, value = None, x
      records.append((jax.tree_util.keystr(path), id(x), type(x).__name__, meta, _fingerprint(value)))
  return records


@pytest.mark.parametrize('name', CATALOGUE)
def test_bad_input_raises_its_error_naming_the_path(name):
  make, error, message = CATALOGUE[name]
  kwargs = make()
  before = snapshot(kwargs['linen'], kwargs.get('target'))
  with pytest.raises(error) as info:
    converters.linen_to_nnx(**{'paths': KIT_PATHS, **kwargs})
  assert isinstance(info.value, errors.ConversionError)
  assert message in str(info.value), str(info.value)
  assert snapshot(kwargs['linen'], kwargs.get('target')) == before


def test_every_offender_is_listed():
  make, error, _ = CATALOGUE['unmapped params']
  with pytest.raises(error) as info:
    converters.linen_to_nnx(**{'paths': KIT_PATHS, **make()})
  assert set(info.value.paths) == {'DotReluDot_0/bias', 'head/kernel'}


def test_leaf_errors_raise_one_error_as_it_is_and_several_as_one_listing_each():
  def collect(*raised):
    collected = errors.LeafErrors(limit=2)
    for e in raised:
      with collected.leaf():
        raise e
    with collected.leaf():
      pass  # a leaf that passes adds nothing
    return collected

  collect().raise_any()  # nothing failed: nothing raised
  one = errors.ShapeError('a: converted shape (2,)', ['a'], fix='fix it')
  with pytest.raises(errors.ShapeError) as info:
    collect(one).raise_any()
  assert info.value is one
  several = collect(
      errors.AnnotationError('a: bad names', ['a'], fix='fix the names'),
      errors.ShapeError('b: converted shape (2,)', ['b'], fix='fix the shape'),
      errors.AnnotationError('c: bad names', ['c'], fix='fix the names'),
  )
  with pytest.raises(errors.AnnotationError) as info:  # the first failure's class
    several.raise_any()
  assert str(info.value) == (
      '3 leaves do not fit the target: a: bad names; b: converted shape (2,); ... (1 more); '
      'fix the names; fix the shape'
  )
  assert info.value.paths == ('a', 'b', 'c') and info.value.fix == 'fix the names; fix the shape'


def test_duplicate_templates_are_rejected_when_the_mapping_is_built():
  with pytest.raises(errors.PathMappingError, match="linen 'DotReluDot_{i}/W2'"):
    KIT_PATHS + [PathRule('DotReluDot_{i}/W2', 'layers/{i}/other')]


# -- nnx -> linen -------------------------------------------------------------------


class Counter(nnx.Variable):
  pass


def nnx_case_non_param_variable():
  model, _ = nnx_trained(LOOP, 'adam', 0)
  state = nnx.state(model)
  state['layers'][0]['calls'] = Counter(jnp.zeros(()))
  return dict(nnx_in=state)


def nnx_case_unknown_optimizer():
  model, _ = nnx_trained(LOOP, 'adam', 0)

  class Custom(nnx.Pytree):
    def __init__(self):
      self.step = nnx.OptState(jnp.zeros((), jnp.uint32))

  return dict(nnx_in=(model, Custom()), target=linen_trainer(LOOP, 'adam').abstract_state)


def nnx_case_optimizer_without_target():
  return dict(nnx_in=nnx_trained(LOOP, 'adam', 0))


def nnx_case_target_of_another_optimizer():
  return dict(
      nnx_in=nnx_trained(LOOP, 'adam', 0),
      target=linen_trainer(LOOP, 'sgd_momentum').abstract_state,
  )


def nnx_case_pair_of_nones():
  return dict(nnx_in=(None, None))


def nnx_case_target_on_another_mesh():
  other = description('device', False, mesh_shape=(8, 1))
  return dict(nnx_in=nnx_trained(LOOP, 'adam', 0), target=linen_trained(other, 'adam', 0))


def nnx_case_model_only_with_a_train_state_target():
  return dict(nnx_in=nnx_trained(LOOP, 'adam', 0)[0], target=linen_trainer(LOOP, 'adam').abstract_state)


def nnx_case_target_with_other_layers():
  fewer = dataclasses.replace(LOOP, num_layers=2)
  return dict(nnx_in=nnx_trained(LOOP, 'adam', 0), target=linen_trainer(fewer, 'adam').abstract_state)


def nnx_case_target_of_another_depth():
  other = dataclasses.replace(LOOP, depth=32)
  return dict(nnx_in=nnx_trained(LOOP, 'adam', 0), target=linen_trainer(other, 'adam').abstract_state)


def nnx_case_rule_missing_on_both_sides():
  rules = [r for r in KIT_PATHS.rules if r.linen != 'DotReluDot_{i}/W2']
  return dict(
      nnx_in=nnx_trained(LOOP, 'adam', 0), target=linen_trainer(LOOP, 'adam').abstract_state,
      paths=converters.PathMapping(rules),
  )


def nnx_case_intermediate():
  model, _ = nnx_trained(LOOP, 'adam', 0)
  state = nnx.state(model)
  state['layers'][0]['sown'] = nnx.Intermediate(jnp.zeros(2))
  return dict(nnx_in=state)


def nnx_case_names_mixing_ruled_and_unruled():
  model, _ = nnx_trained(LOOP, 'adam', 0)
  state = nnx.state(model)
  kernel = state['layers'][0]['dot1']['kernel']
  state['layers'][0]['dot1']['kernel'] = kernel.replace(kernel.get_value())
  state['layers'][0]['dot1']['kernel'].set_metadata(out_sharding=('embed', 'model'))
  return dict(nnx_in=state, rules=LOGICAL.rules)


NNX_CATALOGUE = {
    'Variable type of no collection': (nnx_case_non_param_variable, errors.StructureError, "model/layers/0/calls: no Linen collection is known for the Variable type Counter; if Linen keeps it in a collection, pass collections={'<collection name>': Counter}; if Linen computes it on the fly"),
    'unknown optimizer': (nnx_case_unknown_optimizer, errors.OptimizerStateError, 'optimizer of type Custom'),
    'optimizer without target': (nnx_case_optimizer_without_target, errors.StructureError, 'target=TrainState'),
    'target of another optimizer': (nnx_case_target_of_another_optimizer, errors.OptimizerStateError, '0/mu/DotReluDot_0/Dense_0/kernel'),
    '(None, None)': (nnx_case_pair_of_nones, errors.StructureError, 'with both present, got (NoneType, NoneType)'),
    'target on another mesh': (nnx_case_target_on_another_mesh, errors.LayoutError, "params/DotReluDot_0/Dense_0/kernel: the converted array lives on mesh {'data': 2, 'model': 4}"),
    'model only, TrainState target': (nnx_case_model_only_with_a_train_state_target, errors.StructureError, 'a TrainState target needs (model, optimizer)'),
    'target with other layers': (nnx_case_target_with_other_layers, errors.StructureError, 'DotReluDot_2/Dense_0/kernel'),
    'target of another depth': (nnx_case_target_of_another_depth, errors.ShapeError, '6 leaves do not fit the target: params/DotReluDot_0/Dense_0/kernel: converted shape (64, 64), target expects (32, 32)'),
    'rule missing on both sides': (nnx_case_rule_missing_on_both_sides, errors.PathMappingError, 'no rule maps these nnx paths: layers/0/w2, layers/1/w2, layers/2/w2; and no rule maps these linen paths of the target: DotReluDot_0/W2, DotReluDot_1/W2, DotReluDot_2/W2'),
    'Intermediate': (nnx_case_intermediate, errors.StructureError, 'model/layers/0/sown: is an nnx.Intermediate'),
    'names mixing ruled and unruled': (nnx_case_names_mixing_ruled_and_unruled, errors.AnnotationError, "model/layers/0/dot1/kernel: names ('embed', 'model') mix logical names ['embed']"),
}


@pytest.mark.parametrize('name', NNX_CATALOGUE)
def test_bad_nnx_input_raises_its_error_naming_the_path(name):
  make, error, message = NNX_CATALOGUE[name]
  kwargs = make()
  before = snapshot(kwargs['nnx_in'], kwargs.get('target'))
  with pytest.raises(error) as info:
    converters.nnx_to_linen(**{'paths': KIT_PATHS, **kwargs})
  assert isinstance(info.value, errors.ConversionError)
  assert message in str(info.value), str(info.value)
  assert snapshot(kwargs['nnx_in'], kwargs.get('target')) == before


def test_relayout_refuses_a_collection_it_knows_no_variable_type_for():
  tree = {'params': params_of(SCAN), 'ema': params_of(SCAN)}
  with pytest.raises(errors.StructureError, match="collection 'ema'; pass collections={'ema': VariableType}"):
    converters.relayout(tree, scan=False, paths=KIT_PATHS)


def test_a_stacked_length_error_lists_its_path():
  for case in ('stacked length != num_layers', 'num_layers, stacked layout kept'):
    make, error, _ = CATALOGUE[case]
    with pytest.raises(error) as info:
      converters.linen_to_nnx(**{'paths': KIT_PATHS, **make()})
    assert set(info.value.paths) == {'ScanDotReluDot_0/Dense_0/kernel', 'ScanDotReluDot_0/W2'}, case


def test_a_huge_num_layers_is_refused_at_once_naming_a_few_missing_layers():
  with pytest.raises(errors.StructureError) as info:
    converters.linen_to_nnx({'params': params_of(LOOP)}, num_layers=10**12, paths=KIT_PATHS)
  assert 'DotReluDot_3/Dense_0/kernel' in str(info.value)
  assert f'({10**12 - 3 - 50} more)' in str(info.value)
  assert len(info.value.paths) <= 2 * 50
