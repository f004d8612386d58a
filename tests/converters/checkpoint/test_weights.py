"""Tests of `converters.checkpoint.weights`: checkpoints of weights only, in every form, both ways.

Pretrained weights come as their owners saved them: Linen variables or
params with Orbax, `flax.serialization.to_bytes(params)`, a
`flax.training.checkpoints` save of params, NNX `nnx.state(model)`,
`nnx.state(model, nnx.Param)` or its pure dict. Each converts, restores with
the other side's ordinary code, and is proven by outputs: the restored model
computes what the original does on the same inputs, bit for bit (one program
on both sides, as in `test_models`).
"""

from __future__ import annotations

import contextlib
import os

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax import nnx
from flax import serialization
from flax.training import checkpoints as flax_checkpoints

from converters import PathRule, compare_checkpoints, convert_checkpoint
from converters.checkpoint.compare import compare_outputs
from converters.checkpoint.convert import CheckpointOptions
from converters.checkpoint.inspect import string_path
from linen_nnx_cli.kit_models import KitModels, models_for
from converters.checkpoint.models import UserModels
from converters.errors import CheckpointError, VerificationError
from tests.converters.checkpoint import small_models as small
from tests.converters.checkpoint.test_models import PAIRS, in_mesh, linen_nnx, mesh, models_of

X = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)


def save(path, tree):
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.fspath(path), tree)


def linen_variables(pair, layout=None):
  """The pair's Linen model and the variables its `init` returns (boxed): one
  program, under the mesh and rules only for a pair annotated with logical
  names (the others' sources are made, and saved, on one device as their
  owners make them)."""
  model = pair['linen']() if layout is None else pair['linen'](layout=layout)
  concrete = [np.zeros(a.shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a for a in model.args]
  init = jax.jit(lambda key, *xs: model.module.init(key, *xs, **model.kwargs))
  with in_mesh(pair['rules']) if pair['rules'] is not None else contextlib.nullcontext():
    return model, dict(init(jax.random.key(3), *concrete))


def write_linen(path, form, variables):
  """`variables` saved in `form`, as their owners save them."""
  params = variables['params']
  if form == 'variables':
    save(path, variables)
  elif form == 'params':
    save(path, {'params': params})
  elif form == 'msgpack':
    path.write_bytes(serialization.to_bytes(nn.unbox(params)))
  else:  # flax.training.checkpoints of the bare params, msgpack or Orbax
    previous = flax.config.flax_use_orbax_checkpointing
    flax.config.update('flax_use_orbax_checkpointing', form == 'flax-orbax')
    try:
      flax_checkpoints.save_checkpoint(os.fspath(path), params, step=7)
    finally:
      flax.config.update('flax_use_orbax_checkpointing', previous)


def restore_nnx(path, pair, everything: bool):
  """The port's ordinary restore of weights: its model, made for real, then
  `nnx.state(model)` (or its `nnx.Param`s) as Orbax's target, and `nnx.update`."""
  with in_mesh(pair['rules']):
    model = nnx.jit(pair['nnx'])()
    target = nnx.state(model) if everything else nnx.state(model, nnx.Param)
    with ocp.StandardCheckpointer() as checkpointer:
      nnx.update(model, checkpointer.restore(os.fspath(path), target))
  return model


def stored_specs(path) -> dict:
  """`{leaf: partition spec}` the written checkpoint's own metadata records."""
  meta = ocp.StandardCheckpointer().metadata(os.fspath(path)).item_metadata.tree
  return {
      string_path(k): tuple(m.sharding.partition_spec) + (None,) * (len(m.shape) - len(m.sharding.partition_spec))
      for k, m in jax.tree_util.tree_flatten_with_path(meta)[0]
  }


def own_specs(model) -> dict:
  """`{leaf: partition spec}` of the Params of a port made for real on the mesh."""
  return {
      string_path(k): tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))
      for k, x in jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
  }


def assert_written_where_the_port_places_it(checkpoint, pair, make_port) -> dict:
  """The checkpoint's own metadata (not a restore, which takes the target's
  shardings) records the specs the port's annotations give its Params;
  returns them."""
  with in_mesh(pair['rules']):
    expected = own_specs(nnx.jit(make_port)())
  stored = stored_specs(checkpoint)
  assert {p: stored[p] for p in expected} == expected
  return expected


def outputs(pair, variables=None, model=None):
  """The Linen model applied to `variables`, or the NNX `model`, on the pair's inputs."""
  linen = pair['linen']()
  inputs = [
      jax.random.randint(jax.random.key(5), a.shape, 0, 2).astype(a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a
      for a in linen.args
  ]
  with in_mesh(pair['rules']):
    if model is None:
      return jax.jit(lambda v, *xs: linen.module.apply(v, *xs, **linen.kwargs))(variables, *inputs)
    model.eval()
    return nnx.jit(lambda m, *xs: m(*xs))(model, *inputs)


@pytest.mark.parametrize('name, form', [
    # CI runs the first (CI_EVERY_NTH): every collection, compared by outputs;
    # the transformer's weights change layout in CI, both ways, written with
    # its annotations' shardings (test_weights_change_layout_on_the_way);
    # Flax's directory form is read in CI by test_inspect, weights alone found
    # by the command line's test.
    ('resnet', 'variables'),  # every collection: batch statistics too
    ('transformer', 'msgpack'),  # sharded, logical names; saved without its boxes
    ('cnn', 'flax-msgpack'),
    ('transformer', 'params'),
    ('cnn', 'flax-orbax'),
    ('resnet', 'params'),  # the parameters alone, into a port with batch statistics
])
def test_linen_weights_convert_to_nnx_restore_with_its_own_code_and_come_back(tmp_path, name, form):
  pair = PAIRS[name]
  models = models_for(**models_of(pair, optimizer=None))
  _, variables = linen_variables(pair)
  source = tmp_path / ('weights.msgpack' if form == 'msgpack' else 'weights')
  write_linen(source, form, variables)
  summary = convert_checkpoint(source, tmp_path / 'nnx', 'nnx', models=models)
  # {'params': ...} of a model with no other collection is all its variables
  everything = form == 'variables' or (form == 'params' and set(variables) == {'params'})
  assert summary['step'] is None
  assert summary['destination']['form'] == (
      'an NNX model state (nnx.state(model))' if everything else 'NNX parameters (nnx.state(model, nnx.Param))'
  )
  port = restore_nnx(tmp_path / 'nnx', pair, everything)
  # The port, restored by its own code, computes what the Linen model does.
  np.testing.assert_array_equal(outputs(pair, model=port), outputs(pair, variables))
  expected = assert_written_where_the_port_places_it(tmp_path / 'nnx', pair, pair['nnx'])
  if name == 'transformer':
    assert any(axis is not None for spec in expected.values() for axis in spec)
  if 'batch_stats' in variables and not everything:  # outputs need the statistics it lacks
    with pytest.raises(CheckpointError, match='lacks state the model runs with: batch_stats'):
      compare_outputs(source, tmp_path / 'nnx', models=models)
  else:
    rows, _, _ = compare_outputs(source, tmp_path / 'nnx', models=models)
    assert rows and all(r.identical for r in rows)
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'back', 'linen', models=models)
  rows, _, _ = compare_checkpoints(source, tmp_path / 'back', models=models)
  assert rows and all(r.identical for r in rows)


@pytest.mark.parametrize('name, form', [
    # CI runs every 3rd (CI_EVERY_NTH): the ResNet's whole state and its pure
    # params dict. Nightly, the transformer's: its NNX -> Linen path stays in CI
    # in test_weights_change_layout_on_the_way (scanned NNX params back to a
    # looped Linen, compared leaf by leaf), Linen's ordinary restore of a
    # sharded checkpoint in test_convert.py::
    # test_converted_checkpoint_restores_with_the_other_sides_ordinary_code[nnx-False-linen-scan-fsdp_sgd].
    ('resnet', 'model'), ('transformer', 'params'), ('transformer', 'pure'), ('resnet', 'pure'),
    ('resnet', 'params'),
])
def test_nnx_weights_convert_to_linen_and_restore_with_its_own_code(tmp_path, name, form):
  pair = PAIRS[name]
  models = models_for(**models_of(pair, optimizer=None))
  with in_mesh(pair['rules']):
    port = nnx.jit(pair['nnx'])()
  state = {
      'model': lambda: nnx.state(port), 'params': lambda: nnx.state(port, nnx.Param),
      'pure': lambda: nnx.to_pure_dict(nnx.state(port, nnx.Param)),
  }[form]()
  save(tmp_path / 'nnx', state)
  convert_checkpoint(tmp_path / 'nnx', tmp_path / 'linen', 'linen', models=models, options=CheckpointOptions(in_memory=form == 'params'))
  model, initial = linen_variables(pair)
  with in_mesh(pair['rules']), ocp.StandardCheckpointer() as checkpointer:
    # Linen's ordinary restore: its init traced abstractly, with the boxes' shardings.
    init = lambda key, *xs: model.module.init(key, *xs, **model.kwargs)
    abstract = jax.eval_shape(init, jax.random.key(0), *model.args)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh(), pair['rules'])
    boxed = lambda x: isinstance(x, nn.meta.AxisMetadata)
    placed = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    abstract = jax.tree.map(
        lambda x, s: x.replace_boxed(placed(x.value, s)) if boxed(x) else placed(x, s),
        abstract, shardings, is_leaf=boxed,
    )
    target = abstract if form == 'model' else {'params': abstract['params']}
    restored = checkpointer.restore(os.fspath(tmp_path / 'linen'), target)
  # Proven by outputs, not through the mapping: the parameters alone run with
  # the model's own batch statistics, which the port holds at init too.
  variables = restored if form == 'model' else {**initial, 'params': restored['params']}
  np.testing.assert_array_equal(outputs(pair, variables), outputs(pair, model=port))
  if form != 'model' and name == 'resnet':  # outputs need the batch statistics it lacks
    with pytest.raises(CheckpointError, match='lacks state the model runs with: batch_stats'):
      compare_outputs(tmp_path / 'linen', tmp_path / 'nnx', models=models)


def test_weights_change_layout_on_the_way(tmp_path):
  """One-sided rules of layers, of either side, take no form of the other."""
  pair = PAIRS['transformer']
  own = [
      PathRule.nnx_only('blocks/{i}/pos', nnx_stacked='blocks/pos'),
      PathRule.linen_only('Block_{i}/pos', linen_stacked='ScanBlock_0/pos'),
  ]
  models = models_for(**{**models_of(pair, optimizer=None), 'paths': pair['paths'] + own})
  _, variables = linen_variables(pair)
  write_linen(tmp_path / 'loop', 'params', variables)
  summary = convert_checkpoint(tmp_path / 'loop', tmp_path / 'scan', 'nnx', models=models, layout='scan')
  assert (summary['source']['layout'], summary['destination']['layout']) == ('loop', 'scan')
  expected = assert_written_where_the_port_places_it(tmp_path / 'scan', pair, lambda: pair['nnx']('scan'))
  assert any(axis is not None for spec in expected.values() for axis in spec)
  # The scanned port computes what the looped Linen model does (not a round trip).
  rows, _, _ = compare_outputs(tmp_path / 'loop', tmp_path / 'scan', models=models)
  assert rows and all(r.identical for r in rows)
  convert_checkpoint(tmp_path / 'scan', tmp_path / 'back', 'linen', models=models, layout='loop')
  rows, _, _ = compare_checkpoints(tmp_path / 'loop', tmp_path / 'back', models=models)
  assert rows and all(r.identical for r in rows)


def test_weights_of_another_model_are_refused_leaf_by_leaf(tmp_path):
  _, variables = linen_variables(PAIRS['cnn'])
  write_linen(tmp_path / 'cnn', 'params', variables)
  models = models_for(**models_of(PAIRS['resnet'], optimizer=None))
  with pytest.raises(CheckpointError, match=r'does not hold the weights of .*missing \[.*\], unexpected \[.*Conv_0'):
    convert_checkpoint(tmp_path / 'cnn', tmp_path / 'out', 'nnx', models=models)
  assert not (tmp_path / 'out').exists()


def test_a_tree_that_is_the_weights_of_both_models_is_refused_not_guessed(tmp_path):
  """A port that kept Linen's names: its pure params dict is Linen's bare params."""
  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(4, name='dense')(x)

  class Port(nnx.Module):
    def __init__(self, rngs):
      self.dense = nnx.Linear(8, 4, rngs=rngs)

  models = UserModels(lambda: small.LinenModel(Linen(), small.X), lambda: Port(nnx.Rngs(0)))
  save(tmp_path / 'ambiguous', nnx.to_pure_dict(nnx.state(Port(nnx.Rngs(0)), nnx.Param)))
  with pytest.raises(CheckpointError, match=r"is the weights of both models .*Linen's \{'params': \.\.\.\}"):
    convert_checkpoint(tmp_path / 'ambiguous', tmp_path / 'out', 'linen', models=models)
  save(tmp_path / 'named', nnx.state(Port(nnx.Rngs(0)), nnx.Param))  # Variables say NNX
  assert convert_checkpoint(tmp_path / 'named', tmp_path / 'out', 'linen', models=models)['source']['framework'] == 'nnx'


def test_weights_and_a_training_state_are_not_compared_as_one(tmp_path):
  from tests.converters.checkpoint.test_hostile_models import linen_state

  state = linen_state(small.make_tx())
  save(tmp_path / 'state', state)
  save(tmp_path / 'params', {'params': state.params})
  models = UserModels(small.linen_mlp, small.nnx_mlp, paths=small.PATHS, optimizer=small.make_tx)
  with pytest.raises(VerificationError, match='A and B hold different things: A a training state, B Linen'):
    compare_checkpoints(tmp_path / 'state', tmp_path / 'params', models=models)
  with pytest.raises(CheckpointError, match=r"holds weights only .*no optimizer is needed"):
    compare_checkpoints(tmp_path / 'params', tmp_path / 'params', models=KitModels())


def test_the_command_line_says_it_found_weights_only(tmp_path, capsys):
  pair = PAIRS['cnn']
  _, variables = linen_variables(pair)
  write_linen(tmp_path / 'weights.msgpack', 'msgpack', variables)
  module = 'tests.converters.checkpoint.zoo_models'
  options = ['--linen-model', f'{module}:linen_cnn', '--nnx-model', f'{module}:nnx_cnn', '--paths', f'{module}:CNN_PATHS']
  assert linen_nnx('convert', tmp_path / 'weights.msgpack', tmp_path / 'nnx', '--to', 'nnx', *options) == 0
  out = capsys.readouterr().out
  assert 'weights only: a bare Linen params tree -> NNX parameters (nnx.state(model, nnx.Param))' in out
  (line,) = [l for l in out.splitlines() if l.startswith('converted ')]
  assert 'step ' not in line and ' arrays, ' in line
  assert linen_nnx('compare', tmp_path / 'weights.msgpack', tmp_path / 'nnx', *options) == 0


def test_weights_are_only_read_whatever_the_destination_is_called(tmp_path):
  """A DST inside SRC, spelled through `..` or a symlink, is refused before
  anything is read or written; SRC is left as it was."""
  from tests.converters.checkpoint.fixtures import tree_checksum

  _, variables = linen_variables(PAIRS['cnn'])
  write_linen(tmp_path / 'weights', 'params', variables)
  (tmp_path / 'link').symlink_to(tmp_path / 'weights')
  before = tree_checksum(tmp_path / 'weights')
  models = models_for(**models_of(PAIRS['cnn'], optimizer=None))
  for dst in (tmp_path / 'weights' / 'out', tmp_path / 'other' / '..' / 'weights' / 'out', tmp_path / 'link' / 'out'):
    with pytest.raises(CheckpointError, match='inside the source'):
      convert_checkpoint(tmp_path / 'weights', dst, 'nnx', models=models)
  assert tree_checksum(tmp_path / 'weights') == before
