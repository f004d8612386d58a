"""`converters.port.layer_subclasses`: a user's subclass of a Flax layer read
as plain data and written as a subclass of the NNX layer, which computes
what the Linen one does."""

from __future__ import annotations

import types
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from converters.port import layer_subclasses, layers, source
from converters.port.errors import Untranslatable
from tests.converters.port.golden.layer_subclass import StdConv, weight_standardize



class ScaledDense(nn.Dense):
  def param(self, name, init_fn, *init_args):
    value = super().param(name, init_fn, *init_args)
    return value * 2 if name == 'bias' else value


class ReadsTheInitializer(nn.Dense):
  def param(self, name, init_fn, *init_args):
    value = super().param(name, init_fn, *init_args)
    return value + init_fn(jax.random.key(0), value.shape)


class MoreThanParam(nn.Dense):
  def param(self, name, init_fn, *init_args):
    value = super().param(name, init_fn, *init_args)
    return value

  def extra(self):
    return 1


class DoubledNorm(nn.LayerNorm):
  def param(self, name, init_fn, *init_args):
    value = super().param(name, init_fn, *init_args)
    return value * 2


class OwnField(nn.Dense):
  eps: float = 1e-5


class OwnDefault(nn.Dense):
  kernel_init: Callable = nn.initializers.zeros  # a default the NNX layer would not have

  def param(self, name, init_fn, *init_args):
    value = super().param(name, init_fn, *init_args)
    return value * 2


class OwnCall(nn.Dense):
  def __call__(self, x):
    return super().__call__(x) * 2


def test_a_subclass_with_the_layers_fields_has_the_layers_spec_written_as_itself():
  spec = layers.layer_spec(StdConv)
  assert spec is not None and spec.nnx == 'nnx.Conv' and spec.linen is StdConv
  assert spec.written == 'StdConv' and layers.layer_spec(nn.Conv).written == 'nnx.Conv'
  assert spec.nnx_argument('features') == 'out_features'  # built as nnx.Conv is


@pytest.mark.parametrize('cls', [OwnField, OwnDefault, OwnCall])
def test_a_subclass_with_fields_defaults_or_a_call_of_its_own_is_not_the_layer(cls):
  assert layers.layer_spec(cls) is None


def test_the_override_is_read_as_the_name_the_value_and_what_follows():
  override = layer_subclasses.read_override(StdConv, source.file_of(StdConv))
  assert override.name.name.value == 'name' and override.value == 'param'
  assert len(override.body) == 2  # the `if` and the `return`


@pytest.mark.parametrize('cls, reason', [
    (ReadsTheInitializer, 'reads init_fn'),
    (MoreThanParam, 'defines extra'),
])
def test_an_override_that_does_more_than_change_the_value_is_refused_saying_what(cls, reason):
  with pytest.raises(Untranslatable, match=reason) as raised:
    layer_subclasses.class_source(cls, layers.layer_spec(cls), source.file_of(cls))
  assert raised.value.line is not None


def _written(cls) -> types.ModuleType:
  """The written class, run in a namespace holding what its module reads."""
  text = layer_subclasses.class_source(cls, layers.layer_spec(cls), source.file_of(cls))
  namespace = types.ModuleType('written')
  namespace.__dict__.update(nnx=nnx, weight_standardize=weight_standardize)
  exec(compile(text, '<written>', 'exec'), namespace.__dict__)  # noqa: S102 - the port's own output
  return namespace


@pytest.mark.parametrize('cls, build, shape', [
    (StdConv, lambda c: c(3, 4, (3, 3), rngs=nnx.Rngs(0)), (2, 6, 6, 3)),
    (ScaledDense, lambda c: c(3, 5, rngs=nnx.Rngs(0)), (2, 3)),
])
def test_the_written_subclass_computes_what_the_linen_one_does_bit_for_bit(cls, build, shape):
  written = getattr(_written(cls), cls.__name__)
  model = build(written)
  x = jax.random.normal(jax.random.key(1), shape)
  features = model.out_features
  linen = cls(features, **({'kernel_size': (3, 3)} if cls is StdConv else {}))
  variables = {'params': {'kernel': model.kernel[...] + 0.5,
                          'bias': jax.random.normal(jax.random.key(2), (features,))}}
  model.kernel[...] = variables['params']['kernel']
  model.bias[...] = variables['params']['bias']
  np.testing.assert_array_equal(model(x), linen.apply(variables, x))


def test_a_masked_kernel_is_refused_where_nnx_masks_before_the_override():
  written = _written(StdConv).StdConv
  with pytest.raises(NotImplementedError, match='masks it'):
    written(3, 4, (3, 3), mask=jnp.ones((3, 3, 3, 4)), rngs=nnx.Rngs(0))


def test_a_layer_whose_parameters_reach_no_hook_is_refused():
  spec = layers.layer_spec(DoubledNorm)
  assert spec is not None
  with pytest.raises(Untranslatable, match='hands its parameters to no function'):
    layer_subclasses.class_source(DoubledNorm, spec, source.file_of(DoubledNorm))
