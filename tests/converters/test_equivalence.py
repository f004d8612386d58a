"""Hypothesis properties: Linen and NNX are equivalent, conversions lose nothing.

Over every mesh factorisation of 8 devices, 1..6 layers, scanned and looped,
layer axis names, device and logical annotations (guide, FSDP and random rule
sets), float32 and bfloat16, and every supported optimizer (strategies from
`converters.testing`). Run with `--hypothesis-show-statistics` to see the
distribution of generated cases.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
import pytest
from hypothesis import HealthCheck, assume, event, example, given, note, settings, strategies as st

import converters
from converters.errors import ConversionError
from converters.presets import KIT_PATHS
from converters.testing import assert_same_layout
from converters.flat_trees import nest
from kit_mlp.data import make_batches
from kit_mlp.description import FSDP_RULES, GUIDE_RULES, MESH_AXES, ModelDescription
from kit_mlp.optimizers import make_tx
from tests.kit_mlp.strategies import descriptions, optimizers
from linen_impl import train as linen_train
from nnx_impl import train as nnx_train
from tests.converters.conversion_cases import copy
from tests.helpers import assert_trees_bit_equal, compile_with_program, parameter_pairs
from tests.hypothesis_profiles import compiling, pinned

REGRESSION = ModelDescription(  # FSDP rules put 'batch' and 'embed' on 'data'
    num_layers=2, depth=16, batch=4, use_scan=True, layer_partition='layer',
    annotation='logical', rules=FSDP_RULES, mesh_shape=(4, 2),
)


@functools.lru_cache(maxsize=8)
def trainers(desc: ModelDescription, optimizer: str):
  mesh = desc.make_mesh()
  return (
      mesh,
      linen_train.make_trainer(desc, mesh, make_tx(optimizer)),
      nnx_train.make_trainer(desc, mesh, optimizer),
  )


def abstract_objects(trainer):
  objects = nnx.merge(trainer.graphdef, trainer.abstract_state)
  return objects['model'], objects['optimizer']


def is_box(x):
  return isinstance(x, nn.Partitioned)


def metadata_of(tree):
  """Every box's type and fields but the value, in order."""
  return [
      (type(b).__name__, {k: v for k, v in vars(b).items() if k != 'value'})
      for b in jax.tree.leaves(tree, is_leaf=is_box) if is_box(b)
  ]


# 1. Layouts ------------------------------------------------------------------------------


@compiling
@given(desc=descriptions(), optimizer=optimizers())
@example(desc=REGRESSION, optimizer='fsdp_sgd')
def test_linen_and_nnx_creations_have_identical_layouts(desc, optimizer):
  event(f'optimizer {optimizer}')
  mesh, linen, nnx_t = trainers(desc, optimizer)
  with jax.set_mesh(mesh):
    state = linen.create(seed=0)
    from_linen = converters.linen_to_nnx(state, target=abstract_objects(nnx_t), paths=KIT_PATHS)
    created = nnx_t.merge(nnx_t.create(seed=0))
    assert_same_layout({'params': state.params}, created[0], paths=KIT_PATHS)
    a = nnx.to_flat_state(nnx.state(from_linen[1]))
    b = nnx.to_flat_state(nnx.state(created[1]))
    assert [p for p, _ in a] == [p for p, _ in b]
    specs_a = nnx.to_flat_state(nnx.get_partition_spec(nnx.state(from_linen[1])))
    specs_b = nnx.to_flat_state(nnx.get_partition_spec(nnx.state(created[1])))
  assert [p for p, _ in specs_a] == [p for p, _ in a] == [p for p, _ in specs_b]
  for (path, va), (_, vb), (_, sa), (_, sb) in zip(a, b, specs_a, specs_b, strict=True):
    assert sa.get_value() == sb.get_value(), path
    assert va[...].sharding.is_equivalent_to(vb[...].sharding, va.ndim), path


# 2. and 3. Outputs, gradients and training --------------------------------------------


@pinned  # five examples: 4x2 and 2x4 meshes, scanned and looped, logical and device annotations, FSDP rules
@given(desc=descriptions(), optimizer=optimizers(), k=st.integers(1, 3))
@example(desc=REGRESSION, optimizer='adam', k=2)
@example(  # found by hypothesis: inputs sharded on 'data' while 'batch' -> None
    desc=ModelDescription(
        num_layers=1, depth=8, batch=2, annotation='logical',
        rules=(('batch', None), ('hidden', None), ('embed', None), ('layer', None)),
        mesh_shape=(2, 4),
    ),
    optimizer='adam',
    k=1,
)
@example(  # found by the nightly profile: the first kernel's gradient differed in
    # the last bits while NNX read its parameters unconstrained (issue 20)
    desc=ModelDescription(
        num_layers=1, depth=8, batch=2, annotation='logical',
        rules=(('batch', None), ('hidden', None), ('embed', 'data'), ('layer', None)),
        mesh_shape=(2, 4),
    ),
    optimizer='adam',
    k=1,
)
@example(  # found by the nightly profile: the stacked gradients' layer axis is not
    # sharded as the annotation says, so converting them annotated was refused
    desc=ModelDescription(
        num_layers=2, depth=8, batch=2, use_scan=True, layer_partition='data',
        mesh_shape=(2, 4),
    ),
    optimizer='adam',
    k=1,
)
@example(  # plain nnx.Params: gradients sharded (None, 'model') against Linen's ('data', 'model')
    desc=ModelDescription(num_layers=3, depth=24, batch=4, mesh_shape=(2, 4)),
    optimizer='adam',
    k=1,
)
def test_outputs_gradients_and_training_are_identical(desc, optimizer, k):
  """The same program, so the same bits: forward and gradient programs are compared
  as XLA compiles them, then outputs, gradients and training bit for bit."""
  event(f'optimizer {optimizer}')
  mesh, linen, nnx_t = trainers(desc, optimizer)
  with jax.set_mesh(mesh):
    xs, ys = make_batches(desc, mesh, k, seed=3)
    state = linen.create(seed=0)
    model, opt = converters.linen_to_nnx(copy(state), target=abstract_objects(nnx_t), paths=KIT_PATHS)
    arrays = nnx_train.train_state(model, opt)
    arrays = copy(nnx.to_pure_dict(arrays))

    apply_linen, program_linen = compile_with_program(linen.apply, state.params, xs[0])
    apply_nnx, program_nnx = compile_with_program(nnx_t.apply, arrays, xs[0])
    assert program_nnx == program_linen
    y_linen = apply_linen(state.params, xs[0])
    y_nnx = apply_nnx(arrays, xs[0])
    assert_trees_bit_equal(y_nnx, y_linen)
    assert y_nnx.sharding.is_equivalent_to(y_linen.sharding, 2)

    grad_linen, program_linen = compile_with_program(
        jax.jit(jax.grad(linen.loss_fn)), state.params, xs[0], ys[0]
    )
    grad_nnx, program_nnx = compile_with_program(
        jax.jit(lambda m, x, y: nnx.grad(nnx_t.loss_fn)(m, x, y)), model, xs[0], ys[0]
    )
    assert program_nnx == program_linen
    grads_linen = grad_linen(state.params, xs[0], ys[0])
    grads_nnx = grad_nnx(model, xs[0], ys[0])
    # Gradients need not sit where the parameters' annotations say (Linen's
    # nn.scan constrains each layer's slice, not the stacked layer axis), and
    # the converters refuse a misplaced annotated array: compare them bare, by
    # path, and their shardings with NNX's below.
    bare_grads = jax.tree.map(lambda g: g.value, grads_linen, is_leaf=lambda g: isinstance(g, nn.Partitioned))
    converted_grads = converters.linen_to_nnx({'params': bare_grads}, paths=KIT_PATHS)
    assert_trees_bit_equal(nnx.to_pure_dict(converted_grads), nnx.to_pure_dict(grads_nnx))
    for (path, a), (_, b) in zip(nnx.to_flat_state(converted_grads), nnx.to_flat_state(grads_nnx), strict=True):
      assert a[...].sharding.is_equivalent_to(b[...].sharding, a.ndim), path

    state, losses_linen = linen.train_steps(state, xs, ys)
    arrays, losses_nnx = nnx_t.train_steps(arrays, xs, ys)
  assert_trees_bit_equal(losses_nnx, losses_linen)
  back = converters.nnx_to_linen(nnx_t.merge(arrays), target=linen.abstract_state, paths=KIT_PATHS)
  assert_trees_bit_equal(back, state)


# 4. Round trips ------------------------------------------------------------------------


@compiling
@given(desc=descriptions(), optimizer=optimizers(), via_other_layout=st.booleans())
def test_round_trips_are_the_identity(desc, optimizer, via_other_layout):
  event(f'optimizer {optimizer}')
  mesh, linen, nnx_t = trainers(desc, optimizer)
  other_layout = not desc.use_scan if via_other_layout else desc.use_scan
  options = dict(layer_partition=desc.layer_partition, paths=KIT_PATHS)
  with jax.set_mesh(mesh):
    variables = {'params': linen.create(seed=0).params}
    there = converters.linen_to_nnx(variables, scan=other_layout, **options)
    back = converters.nnx_to_linen(there, scan=desc.use_scan, **options)
    assert metadata_of(back) == metadata_of(variables)
    assert_trees_bit_equal(back, variables)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(variables), strict=True):
      assert a.sharding.is_equivalent_to(b.sharding, a.ndim)

    model, opt = nnx_t.merge(nnx_t.create(seed=0))
    state = nnx.state(model)
    there = converters.nnx_to_linen(state, scan=other_layout, **options)
    back = converters.linen_to_nnx(there, scan=desc.use_scan, **options)
  assert_trees_bit_equal(nnx.to_pure_dict(back), nnx.to_pure_dict(state))
  for (p, a), (q, b) in zip(nnx.to_flat_state(back), nnx.to_flat_state(state), strict=True):
    assert p == q
    assert a.get_metadata() == b.get_metadata(), p
    assert a[...].sharding.is_equivalent_to(b[...].sharding, a.ndim), p


# 5. Scanned and looped -----------------------------------------------------------------


def sharded_over(desc: ModelDescription, name: str | None) -> str | None:
  """The mesh axis of size > 1 that the annotation name `name` resolves to, if any."""
  axis = desc.mesh_axis(name)
  return axis if axis is not None and desc.mesh_shape[MESH_AXES.index(axis)] > 1 else None


def contraction_is_sharded(desc: ModelDescription) -> bool:
  """Whether a matmul of the MLP contracts over a dimension split across devices."""
  return any(sharded_over(desc, names[0]) for names in (desc.axes.kernel, desc.axes.w2))


@pytest.mark.parametrize('contraction', ('replicated', 'sharded'))
@pytest.mark.parametrize('direction', ('scan-to-loop', 'loop-to-scan'))
@given(scanned=descriptions(dtypes=('float32',), layouts=(True,)))
# Replicated contractions are rare draws: filtering for them is cheap (no compile).
@settings(compiling, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@example(  # found by hypothesis (loop to scan): 'embed' on 'data', the batch replicated
    scanned=ModelDescription(
        num_layers=1, depth=8, batch=2, annotation='logical', mesh_shape=(2, 4), use_scan=True,
        rules=(('batch', None), ('hidden', None), ('embed', 'data'), ('layer', None)),
    ),
)
@example(  # the stacked layer axis sharded over 'data'
    scanned=ModelDescription(
        num_layers=4, depth=16, batch=4, use_scan=True, layer_partition='data',
        mesh_shape=(4, 2),
    ),
)
def test_scanned_and_looped_models_with_the_same_params_agree(direction, contraction, scanned):
  # Stratified, so that even the few `ci` examples cover both directions and
  # both assertions below.
  assume(contraction_is_sharded(scanned) == (contraction == 'sharded'))
  looped = dataclasses.replace(scanned, use_scan=False, layer_partition=None)
  desc, other = (scanned, looped) if direction == 'scan-to-loop' else (looped, scanned)
  stacked = sharded_over(scanned, scanned.layer_partition)
  event(f'stacked layer axis {"sharded over " + stacked if stacked else "replicated"}')
  mesh, linen, _ = trainers(desc, 'adam')
  _, linen_other, nnx_other = trainers(other, 'adam')
  with jax.set_mesh(mesh):
    x = make_batches(desc, mesh, seed=5)[0]
    params = linen.create(seed=0).params
    relaid = converters.relayout({'params': params}, scan=other.use_scan,
                                 layer_partition=other.layer_partition, paths=KIT_PATHS)
    y = linen.apply(params, x)
    y_linen_other = linen_other.apply(relaid['params'], x)
    model = nnx_other.merge(nnx_other.create(seed=0))[0]
    nnx.update(model, converters.linen_to_nnx(relaid, paths=KIT_PATHS))
    y_nnx_other = nnx.jit(lambda m, x: m(x))(model, x)
  assert_same_layout(relaid, model, scan=other.use_scan, paths=KIT_PATHS)
  # Same layout, other framework: the same program, so bit for bit.
  assert_trees_bit_equal(y_nnx_other, y_linen_other)
  if contraction == 'sharded':
    # A matmul over a sharded dimension sums per-device partial results, and XLA
    # may partition a scan body and an unrolled loop differently, so the
    # float32 sums can round differently (seen: 1-2 ulp). Exact otherwise.
    np.testing.assert_allclose(y_linen_other, y, rtol=1e-5, atol=1e-6)
  else:
    assert_trees_bit_equal(y_linen_other, y)


# 6. Logical names and rules --------------------------------------------------------------


@compiling
@given(desc=descriptions(annotations=('logical',)))
def test_logical_names_shard_as_the_device_axes_they_resolve_to(desc):
  mesh, linen, nnx_t = trainers(desc, 'adam')
  with jax.set_mesh(mesh):
    state = linen.create(seed=0)
    model = nnx_t.merge(nnx_t.create(seed=0))[0]
  flat = jax.tree_util.tree_flatten_with_path(state.params, is_leaf=is_box)[0]
  boxes = {('params',) + tuple(k.key for k in p): b for p, b in flat}
  variables = {('model',) + tuple(p): v for p, v in nnx.to_flat_state(nnx.state(model))}
  # Pair them by the paths written out in the tests, not by flattening order.
  pairs = parameter_pairs(desc)
  assert set(boxes) == {a for a, _ in pairs} and set(variables) == {b for _, b in pairs}
  for box, var in ((boxes[a], variables[b]) for a, b in pairs):
    device_axes = nn.logical_to_mesh_axes(box.names, desc.rules)
    want = jax.sharding.NamedSharding(mesh, device_axes)
    assert box.value.sharding.is_equivalent_to(want, box.value.ndim), box.names
    assert var[...].sharding.is_equivalent_to(want, var.ndim), var.get_metadata()
    # The same layout written with device axes converts to identical shardings.
    device_box = nn.Partitioned(box.value, tuple(device_axes))
    (converted,) = jax.tree.leaves(converters.linen_to_nnx({'params': {'DotReluDot_0': {'W2': device_box}}}, paths=KIT_PATHS))
    assert converted.sharding.is_equivalent_to(want, box.value.ndim)
  if desc.rules == GUIDE_RULES:  # the guide's logical and device models coincide
    device = dataclasses.replace(desc, annotation='device', layer_partition=None)
    _, device_linen, _ = trainers(device, 'adam')
    a_tree, b_tree = device_linen.sharding.params, linen.sharding.params
    assert jax.tree.structure(a_tree) == jax.tree.structure(b_tree)
    for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree), strict=True):
      assert a.is_equivalent_to(b, 2 + desc.use_scan)


# 7. Fuzz ----------------------------------------------------------------------------------

CORRUPTIONS = ('drop', 'add', 'reshape', 'retype', 'reannotate', 'drop_rule', 'unbox')
# Whether each corruption must raise (without and with a target); where it
# need not, the tree must convert exactly.
MUST_RAISE = {
    'drop': (False, True),  # a smaller model converts; the target lacks nothing
    'add': (True, True),  # no rule maps the added path
    'reshape': (True, True),  # the names no longer fit the rank
    'retype': (False, True),  # an int32 model converts; the target is float32
    # One bare array among boxed ones: replicated, as Linen reads it; with a
    # target, see must_raise. (strict=True refuses it alone.)
    'unbox': (False, True),
}


def must_raise(kind, with_target, box, argument) -> bool | None:
  """Whether the conversion must raise; None where either outcome is right."""
  if kind == 'reannotate':
    return None  # valid names for the array convert, others raise
  if kind == 'unbox' and with_target:
    # The bare array reads as replicated: the target is filled (in its own
    # form) when its annotation resolves to replicated too, as some rule sets do.
    names = box.names if not isinstance(box, nn.LogicallyPartitioned) else nn.logical_to_mesh_axes(box.names, box.rules)
    return any(axis is not None for axis in names)
  if kind == 'drop_rule':
    # A name left without a rule raises. A rule no name uses changes no spec,
    # so a target (which keeps the rule) is filled in its own form.
    return box.rules[argument][0] in box.names
  return MUST_RAISE[kind][with_target]


NAMES = st.sampled_from([None, 'data', 'model', 'embed', 'hidden', 'layer', 'nope'])


@st.composite
def corruptions(draw, kind, desc, params):
  """`(index, argument)`: a corruption of `kind` that really changes the tree."""
  flat = jax.tree.leaves(params, is_leaf=is_box)
  index = draw(st.integers(0, len(flat) - 1))
  box = flat[index]
  if kind == 'reannotate':
    names = draw(st.lists(NAMES, min_size=1, max_size=4).map(tuple).filter(lambda n: n != box.names))
    return index, names
  if kind == 'drop_rule':
    return index, draw(st.integers(0, len(box.rules) - 1))
  return index, None


def corrupt(params, kind, index, argument):
  """A corrupted copy of a boxed params tree (the input stays as it was)."""
  flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_box)[0]
  paths = [tuple(k.key for k in p) for p, _ in flat]
  box = flat[index][1]
  rebuilt = {path: leaf for path, (_, leaf) in zip(paths, flat)}
  path = paths[index]
  if kind == 'drop':
    del rebuilt[path]
  elif kind == 'add':
    path = path[:-1] + ('extra',)
    rebuilt[path] = box
  elif kind == 'reshape':
    rebuilt[path] = box.replace(value=box.value.reshape(-1))
  elif kind == 'retype':
    rebuilt[path] = box.replace(value=box.value.astype(jnp.int32))
  elif kind == 'reannotate':
    rebuilt[path] = box.replace(names=argument)
  elif kind == 'drop_rule':
    rebuilt[path] = box.replace(rules=box.rules[:argument] + box.rules[argument + 1:])
  elif kind == 'unbox':
    rebuilt[path] = box.value
  return nest(rebuilt), path


def in_the_form_of(params, bad):
  """`bad`'s values in `params`' boxes (names and rules), path by path."""
  form = {tuple(k.key for k in p): box for p, box in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_box)[0]}
  flat = jax.tree_util.tree_flatten_with_path(bad, is_leaf=is_box)[0]
  return nest({
      path: form[path].replace(value=leaf.value if is_box(leaf) else leaf)
      for path, leaf in ((tuple(k.key for k in p), leaf) for p, leaf in flat)
  })


def spellings(desc: ModelDescription, linen_path: tuple) -> list[str]:
  """How an error may name a Linen parameter: its Linen or its NNX path."""
  names = ['/'.join(linen_path)]
  for linen, nnx_path in parameter_pairs(desc):
    if linen[1:] == linen_path:
      names.append('/'.join(map(str, nnx_path[1:])))
  return names


@pytest.mark.parametrize('kind', CORRUPTIONS)
# Every example draws a model of its own: CI takes the simplest (CI_EVERY_NTH
# keeps the `drop` kind), `make nightly` explores every kind.
@compiling
@given(data=st.data())
def test_corrupted_trees_convert_exactly_or_raise_an_error_naming_the_path(kind, data):
  # Boxes carry rules only with logical names: elsewhere dropping one changes nothing.
  annotations = ('logical',) if kind == 'drop_rule' else ('device', 'logical')
  desc = data.draw(descriptions(max_layers=3, dtypes=('float32',), annotations=annotations), label='desc')
  mesh, linen, nnx_t = trainers(desc, 'adam')
  with jax.set_mesh(mesh):
    params = linen.create(seed=0).params
    index, argument = data.draw(corruptions(kind, desc, params))
    box = jax.tree.leaves(params, is_leaf=is_box)[index]
    bad, path = corrupt(params, kind, index, argument)
    note(f'corruption: {kind} of {"/".join(path)} ({argument})')
    before = [(id(x), vars(x).copy() if is_box(x) else None) for x in jax.tree.leaves(bad, is_leaf=is_box)]
    for with_target, target in ((False, None), (True, abstract_objects(nnx_t)[0])):
      try:
        result = converters.linen_to_nnx({'params': bad}, target=target, paths=KIT_PATHS)
      except ConversionError as e:
        event(f'{kind} raises {type(e).__name__}' + (' with a target' if with_target else ''))
        assert must_raise(kind, with_target, box, argument) in (True, None), e
        assert any(name in str(e) for name in spellings(desc, path)), e
        continue
      event(f'{kind} converts' + (' with a target' if with_target else ''))
      assert must_raise(kind, with_target, box, argument) in (False, None)
      state = result if target is None else nnx.state(result)
      back = converters.nnx_to_linen(state, paths=KIT_PATHS)
      # A target's annotations win where they resolve to the same spec.
      expected = bad if target is None else in_the_form_of(params, bad)
      assert_trees_bit_equal(back['params'], expected)
    after = [(id(x), vars(x) if is_box(x) else None) for x in jax.tree.leaves(bad, is_leaf=is_box)]
  assert after == before
