"""Tests of `converters.port.prove`: what the proof gives the port it builds."""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from converters import LinenModel
from converters.port import prove


class Block(nn.Module):
  conv: type = nn.Conv

  @nn.compact
  def __call__(self, x):
    return self.conv(4, (3, 3))(x)


class PortedBlock(nnx.Module):
  pass


GENERATED = types.ModuleType('generated')
GENERATED.Block = PortedBlock


def test_module_classes_the_model_is_configured_with_become_nnx_counterparts():
  assert prove.nnx_value(nn.Conv, GENERATED) is nnx.Conv
  assert prove.nnx_value(Block, GENERATED) is PortedBlock
  assert prove.nnx_value(nn.relu, GENERATED) is nn.relu  # not a module: as it is
  assert prove.nnx_value(3, GENERATED) == 3


def test_partials_take_nnx_names_recursively_and_never_fix_a_mode():
  norm = prove.nnx_value(functools.partial(nn.BatchNorm, momentum=0.9), GENERATED)
  assert norm.func is nnx.BatchNorm and norm.keywords == {'momentum': 0.9}
  with pytest.raises(TypeError, match='fixing use_running_average=True, a mode NNX sets for every layer'):
    prove.nnx_value(functools.partial(nn.BatchNorm, use_running_average=True), GENERATED)
  dense = prove.nnx_value(functools.partial(nn.Dense, features=3, use_bias=False), GENERATED)
  assert dense.func is nnx.Linear and dense.keywords == {'out_features': 3, 'use_bias': False}
  block = prove.nnx_value(functools.partial(Block, conv=functools.partial(nn.Conv, use_bias=False)), GENERATED)
  assert block.func is PortedBlock
  assert block.keywords['conv'].func is nnx.Conv and block.keywords['conv'].keywords == {'use_bias': False}


def test_a_linen_class_the_port_has_no_class_for_is_refused():
  class Unported(nn.Module):
    pass

  with pytest.raises(TypeError, match='configured with the Linen class Unported'):
    prove.nnx_value(Unported, GENERATED)


class Replicated(nn.Module):
  axis: str | None = 'batch'
  other: str | None = None

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.BatchNorm(use_running_average=not train, axis_name=self.axis)(x)
    return nn.BatchNorm(use_running_average=not train, axis_name=self.other)(x)


def test_the_batch_axis_is_read_from_the_layers_and_several_are_refused():
  x = jnp.ones((2, 3))
  assert prove.batch_axis_name(LinenModel(Replicated(), x)) == 'batch'
  assert prove.batch_axis_name(LinenModel(Replicated(axis=None), x)) is None
  with pytest.raises(AssertionError, match=r"mapped axes \['batch', 'devices'\]"):
    prove.batch_axis_name(LinenModel(Replicated(other='devices'), x))


class Draws(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    if train:
      x = x + jax.random.normal(self.make_rng('noise'), x.shape)
    return nn.Dropout(0.5, deterministic=not train)(nn.Dense(2)(x))


def test_the_streams_a_model_draws_are_read_with_its_flags_turned_round():
  assert prove.drawn_streams(LinenModel(Draws(), jnp.ones((2, 3)), train=False)) == ('dropout', 'noise')
  assert prove.drawn_streams(LinenModel(Block(), jnp.ones((2, 5, 5, 3)))) == ()


class _Residual(nn.Module):
  channels: int = 1

  @nn.compact
  def __call__(self, x):
    return x - nn.Dense(self.channels)(nn.Dense(3)(x))


def test_inputs_the_port_ties_to_a_field_take_its_value_in_every_other_configuration():
  from converters.port import shapes

  model = LinenModel(_Residual(), jnp.ones((2, 1)))
  tie = {shapes.InputDim(0, 'x', 1, 2, 1): shapes.FieldValue(('channels',))}
  assert prove.tie_descriptions(tie) == ['x.shape[-1] == self.channels']
  tied = prove.other_configurations(model, most=2, ties=tie)
  assert tied  # (+1 and doubled are one configuration here: channels=2)
  for other, description in tied:
    assert other.args[0].shape[-1] == other.module.channels, description
  # Untied, Linen also builds the configurations that broadcast a 1-wide
  # input against more channels (which a port taking the input's width to
  # be `channels` is not written for).
  untied = prove.other_configurations(model, most=2)
  assert any(o.args[0].shape[-1] != o.module.channels for o, _ in untied)


class Stages(nn.Module):
  """Stages of `widths` (looped over), patches of `patch` (a layer's rank)."""

  widths: tuple[int, ...] = (4, 8)
  patch: tuple[int, int] = (2, 2)
  rate: float = 0.1

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(4, self.patch, strides=self.patch)(x)
    for width in self.widths:
      x = nn.Dense(width)(x)
    return nn.Dropout(self.rate, deterministic=True)(x)


def test_moved_configurations_empty_the_tuples_looped_over_not_a_layers_rank():
  model = LinenModel(Stages(), jnp.ones((1, 4, 4, 3)))
  (moved,) = prove.moved_configurations(model, looped={'widths'})
  other, description = moved
  assert description == 'widths=(), rate=0.2'
  assert other.module.widths == () and other.module.patch == (2, 2)
  # A tuple nothing loops over is kept, though Linen builds it empty.
  (moved,) = prove.moved_configurations(model, looped=set())
  assert moved[1] == 'rate=0.2'


@dataclasses.dataclass(frozen=True)
class _Head:
  width: int | None = None


class Defaults(nn.Module):
  mlp_dim: int | None = None
  head: _Head | None = None
  unset: int | None = None
  rate: float = 0.5

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.mlp_dim or 4)(x)
    if self.head is not None:
      x = nn.Dense(self.head.width or 2)(x)
    return x


def test_default_configurations_leave_none_each_field_whose_default_is_none():
  model = LinenModel(Defaults(mlp_dim=3, head=_Head(width=5)), jnp.ones((1, 2)))
  found, unbuilt = prove.default_configurations(model)
  assert [d for _, d in found] == ['mlp_dim=None', 'head=None', 'head.width=None']
  assert found[0][0].module.mlp_dim is None and found[0][0].module.head == _Head(5)
  assert found[2][0].module.head == _Head(None) and not unbuilt


class Hybrid(nn.Module):
  """vit_jax's hybrid: its stages in a namespace (`resnet.num_layers`), looped over."""

  resnet: types.SimpleNamespace = None
  patches: types.SimpleNamespace = None

  @nn.compact
  def __call__(self, x):
    for n in self.resnet.num_layers:
      x = nn.Dense(n + 1)(x)
    return x


def test_a_namespaces_tuples_looped_over_are_emptied_too():
  model = LinenModel(Hybrid(types.SimpleNamespace(num_layers=(1, 2)), types.SimpleNamespace(size=(2, 2))),
                     jnp.ones((1, 3)))
  ((other, description),) = prove.moved_configurations(model, looped={'num_layers'})
  assert description == 'resnet.num_layers=()' and other.module.patches.size == (2, 2)


class WidthOrFlag(nn.Module):
  rep_size: int | bool = False
  mlp_dim: int | None = 16  # admits None, though its default is a width

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.mlp_dim or 4)(x)
    return nn.Dense(self.rep_size if self.rep_size is not True else 5)(x) if self.rep_size else x


def test_a_width_that_takes_a_flag_is_tried_at_each_flag_and_a_flag_at_a_width():
  as_width = LinenModel(WidthOrFlag(rep_size=12), jnp.ones((1, 2)))
  tried, _ = prove.optional_configurations(as_width)
  assert [d for _, d in tried] == ['rep_size=False', 'rep_size=True']
  as_flag = LinenModel(WidthOrFlag(rep_size=True), jnp.ones((1, 2)))
  ((other, description),), _ = prove.optional_configurations(as_flag)
  assert description.startswith('rep_size=') and type(other.module.rep_size) is int
  # An annotation admitting None is left None, whatever its default.
  found, _ = prove.default_configurations(as_flag)
  assert [d for _, d in found] == ['mlp_dim=None']


class Merged(nn.Module):
  """A field merged with its call's flag, as Flax's sst2 merges `deterministic`."""

  width: int = 3
  deterministic: bool | None = None
  use_bias: bool = True

  @nn.compact
  def __call__(self, x, deterministic: bool | None = None):
    deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
    return nn.Dropout(0.5)(nn.Dense(self.width, use_bias=self.use_bias)(x), deterministic=deterministic)


class PortedMerged(nnx.Module):
  def __init__(self, width: int = 3, deterministic: bool | None = None, use_bias: bool = True, *, rngs: nnx.Rngs):
    self.dense = nnx.Linear(2, width, use_bias=use_bias, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.deterministic = deterministic
    self.use_bias = use_bias


def test_a_field_the_ports_mode_sets_is_its_mode_not_a_configuration():
  x = jnp.ones((2, 2))
  # Set on the Linen side, `.train()` / `.eval()` set it on the port: its
  # value in training; a bool the mode leaves alone (`use_bias`) is not one.
  assert prove.fields_the_mode_sets(PortedMerged, LinenModel(Merged(deterministic=True), x)) == {
      'deterministic': False}
  assert prove.fields_the_mode_sets(PortedMerged, LinenModel(Merged(deterministic=False), x)) == {
      'deterministic': False}
  # Left None, the call gives it: the call's flag, not the field.
  assert prove.fields_the_mode_sets(PortedMerged, LinenModel(Merged(), x, deterministic=True)) == {}


class MergedAndTrain(nn.Module):
  """A mode field (dropout) beside a mode flag of the call (batch statistics)."""

  deterministic: bool = True

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.BatchNorm(use_running_average=not train, name='norm')(nn.Dense(4, name='dense')(x))
    return nn.Dropout(0.5)(x, deterministic=self.deterministic)


MERGED_AND_TRAIN_PORT = '''
from flax import nnx


class MergedAndTrain(nnx.Module):
  def __init__(self, deterministic: bool = True, *, rngs: nnx.Rngs):
    self.dense = nnx.Linear(3, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.deterministic = deterministic

  def __call__(self, x):
    x = self.norm(self.dense(x){frozen})
    return self.dropout(x, deterministic=self.deterministic)
'''


@pytest.mark.parametrize('frozen', [False, True])
def test_a_mode_field_beside_a_mode_flag_of_the_call_is_trained_with_both(tmp_path, frozen):
  # The training step calls Linen with the field and the call's flag at
  # their training values: a port whose batch statistics never train fails.
  out = tmp_path / f'merged_and_train_{frozen}_nnx.py'
  out.write_text(MERGED_AND_TRAIN_PORT.replace('{frozen}', ', use_running_average=True' if frozen else ''))
  (tmp_path / f'merged_and_train_{frozen}_nnx_paths.py').write_text('PATHS = None\n')
  generated = prove.import_file(str(out))
  model = LinenModel(MergedAndTrain(), jnp.ones((5, 3)))
  if not frozen:
    prove.assert_generated_port(model, generated, modes={'train': True})
    return
  with pytest.raises(AssertionError, match='training step'):
    prove.assert_generated_port(model, generated, modes={'train': True})
