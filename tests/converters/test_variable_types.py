"""Tests of `converters.variable_types`: every collection converts, in both directions.

A small model with `batch_stats` and dropout (not the kit's MLP), ported with
the Linen names kept, so no path mapping is needed: `params` <-> `nnx.Param`,
`batch_stats` <-> `nnx.BatchStat`, user collections through `collections=`,
`intermediates` and unknown collections refused by name, and the RNG policy
(never written to Linen, kept from an NNX target).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state

import converters
from converters import errors

IN, OUT = 3, 4


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(OUT, name='dense')(x)
    x = nn.BatchNorm(use_running_average=not train, name='norm')(x)
    return nn.Dropout(0.5, deterministic=not train, name='dropout')(x)


class NNXNet(nnx.Module):
  """The port, with Linen's names kept."""

  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(IN, OUT, rngs=rngs)
    self.norm = nnx.BatchNorm(OUT, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.dropout(self.norm(self.dense(x)))


class TrainState(train_state.TrainState):
  batch_stats: Any = None


X = jnp.arange(2.0 * IN).reshape(2, IN) / 7


def linen_variables():
  """Initialised, then one train-mode call so the running statistics are not the initial ones."""
  variables = LinenNet().init(jax.random.key(0), X)
  _, updates = LinenNet().apply(
      variables, X, train=True, rngs={'dropout': jax.random.key(1)}, mutable=['batch_stats']
  )
  return {'params': variables['params'], **updates}


def bits(tree) -> list[tuple[str, bytes]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return [(jax.tree_util.keystr(p), np.asarray(x).tobytes()) for p, x in leaves]


def test_params_and_batch_stats_become_params_and_batch_stats_and_compute_the_same():
  variables = linen_variables()
  state = converters.linen_to_nnx(variables)
  kinds = {'/'.join(map(str, p)): type(v) for p, v in nnx.to_flat_state(state)}
  assert kinds == {
      'dense/kernel': nnx.Param, 'dense/bias': nnx.Param,
      'norm/scale': nnx.Param, 'norm/bias': nnx.Param,
      'norm/mean': nnx.BatchStat, 'norm/var': nnx.BatchStat,
  }
  model = NNXNet(nnx.Rngs(7))
  nnx.update(model, state)
  model.eval()
  np.testing.assert_array_equal(model(X), LinenNet().apply(variables, X))


def test_linen_to_nnx_to_linen_is_the_identity_and_leaves_rng_state_out():
  variables = linen_variables()
  model = NNXNet(nnx.Rngs(7))
  nnx.update(model, converters.linen_to_nnx(variables))
  back = converters.nnx_to_linen(model)
  assert set(back) == {'params', 'batch_stats'}  # no RNG collection: Linen has none
  assert bits(back) == bits(variables)


def test_a_target_keeps_its_own_rng_state():
  model = NNXNet(nnx.Rngs(7))
  rngs_before = {p: v for p, v in nnx.to_flat_state(nnx.state(model, nnx.RngState))}
  new = converters.linen_to_nnx(linen_variables(), target=model)
  rngs_after = dict(nnx.to_flat_state(nnx.state(new, nnx.RngState)))
  assert set(rngs_after) == set(rngs_before) and rngs_before
  for path, var in rngs_before.items():
    assert type(rngs_after[path]) is type(var)
    assert bits(jax.random.key_data(rngs_after[path][...]) if isinstance(var, nnx.RngKey) else rngs_after[path][...]) == bits(
        jax.random.key_data(var[...]) if isinstance(var, nnx.RngKey) else var[...]
    )


def test_an_abstract_target_rng_state_is_refused_by_path_unless_seeded():
  abstract = nnx.eval_shape(lambda: NNXNet(nnx.Rngs(7)))
  with pytest.raises(errors.StructureError, match=r'RNG state is abstract: .*dropout/rngs.* Pass rngs=<seed>'):
    converters.linen_to_nnx(linen_variables(), target=abstract)
  model = converters.linen_to_nnx(linen_variables(), target=abstract, rngs={'default': 3})  # nnx.Rngs(7) is one 'default' stream
  seeded = NNXNet(nnx.Rngs(7))
  nnx.reseed(seeded, default=3)
  expected = jax.random.key_data(seeded.dropout.rngs.key[...])
  assert bits(jax.random.key_data(model.dropout.rngs.key[...])) == bits(expected)
  assert int(model.dropout.rngs.count[...]) == 0
  model.train()
  model(X)  # dropout runs on the seeded stream


@pytest.mark.parametrize('rngs, message', [({'params': 1}, "missing \\['default'\\], unknown \\['params'\\]"), ('0', 'pass an int seed')])
def test_malformed_seeds_are_refused(rngs, message):
  abstract = nnx.eval_shape(lambda: NNXNet(nnx.Rngs(7)))
  with pytest.raises(errors.StructureError, match=message):
    converters.linen_to_nnx(linen_variables(), target=abstract, rngs=rngs)


def test_a_train_state_with_batch_stats_converts_with_its_optimizer_both_ways():
  variables = linen_variables()
  tx = optax.adam(1e-2)
  state = TrainState.create(
      apply_fn=LinenNet().apply, params=variables['params'], tx=tx,
      batch_stats=variables['batch_stats'],
  )
  model = NNXNet(nnx.Rngs(7))
  target = (model, nnx.Optimizer(model, tx, wrt=nnx.Param))
  model, optimizer = converters.linen_to_nnx(state, target=target)
  assert bits(nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))) == bits(variables['batch_stats'])
  back = converters.nnx_to_linen((model, optimizer), target=state)
  assert isinstance(back, TrainState)
  assert bits(back.batch_stats) == bits(state.batch_stats)
  assert bits(back.params) == bits(state.params)
  assert bits(back.opt_state) == bits(state.opt_state)


def test_a_train_state_target_without_a_field_for_a_collection_is_refused():
  variables = linen_variables()
  tx = optax.adam(1e-2)
  plain = train_state.TrainState.create(apply_fn=None, params=variables['params'], tx=tx)
  model = NNXNet(nnx.Rngs(7))
  nnx.update(model, converters.linen_to_nnx(variables))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  with pytest.raises(errors.StructureError, match=r"has \['batch_stats'\] but the TrainState target has no field"):
    converters.nnx_to_linen((model, optimizer), target=plain)


class EMA(nnx.Variable):
  """A user's own collection: an exponential moving average of the params."""


def test_a_user_collection_converts_with_the_type_given_and_is_refused_without_it():
  variables = {**linen_variables(), 'ema': jax.tree.map(jnp.copy, linen_variables()['params'])}
  with pytest.raises(errors.StructureError, match=r"collection 'ema'; pass collections=\{'ema': VariableType\}"):
    converters.linen_to_nnx(variables)
  # The NNX namespace is one tree: the ema copy must live elsewhere than the params.
  paths = converters.PathMapping(
      [converters.PathRule(f'{m}/{k}', f'ema_{m}/{k}') for m, k in
       [('dense', 'kernel'), ('dense', 'bias'), ('norm', 'scale'), ('norm', 'bias')]],
      keep_unmatched=True,
  )
  with pytest.raises(errors.StructureError, match='variables of different collections map to one path'):
    converters.linen_to_nnx(variables, collections={'ema': EMA})
  state = converters.linen_to_nnx(
      {'ema': variables['ema']}, collections={'ema': EMA}, paths=paths
  )
  assert {type(v) for _, v in nnx.to_flat_state(state)} == {EMA}
  back = converters.nnx_to_linen(state, collections={'ema': EMA}, paths=paths)
  assert bits(back) == bits({'ema': variables['ema']})


def test_intermediates_are_refused_on_both_sides():
  variables = {**linen_variables(), 'intermediates': {'dense': {'__call__': (X,)}}}
  with pytest.raises(errors.StructureError, match="'intermediates' collection holds values sown"):
    converters.linen_to_nnx(variables)
  model = NNXNet(nnx.Rngs(7))
  model.dense.sown = nnx.Intermediate(X)
  with pytest.raises(errors.StructureError, match=r'model/dense/sown: is an nnx.Intermediate'):
    converters.nnx_to_linen(model)


def test_a_collection_landing_on_a_variable_of_another_type_is_refused_by_path():
  class Swapped(NNXNet):
    def __init__(self, rngs):
      super().__init__(rngs)
      self.norm.mean = nnx.Param(self.norm.mean[...])

  with pytest.raises(errors.StructureError, match=r"model/norm/mean: converted from the Linen 'batch_stats' collection \(BatchStat Variables\), but the target holds a Param"):
    converters.linen_to_nnx(linen_variables(), target=Swapped(nnx.Rngs(0)))


@pytest.mark.parametrize(
    'collections, message',
    [
        ({'ema': int}, "'ema': <class 'int'>"),
        ({'ema': nnx.RngKey}, 'RNG state excepted'),
        ({'ema': nnx.Param}, "Param \\('params' and 'ema'\\)"),
        ([('ema', EMA)], 'pass a dict'),
    ],
)
def test_malformed_collection_tables_are_refused(collections, message):
  with pytest.raises(errors.StructureError, match=message):
    converters.linen_to_nnx(linen_variables(), collections=collections)


def test_the_converted_model_has_rng_variables_of_its_own():
  target = NNXNet(nnx.Rngs(7))
  count_before = int(target.dropout.rngs.count[...])
  key_before = bits(jax.random.key_data(target.dropout.rngs.key[...]))
  new = converters.linen_to_nnx(linen_variables(), target=target, rngs=11)
  assert new.dropout.rngs.key is not target.dropout.rngs.key
  new.train()
  new(X)
  new(X)
  assert int(target.dropout.rngs.count[...]) == count_before
  assert bits(jax.random.key_data(target.dropout.rngs.key[...])) == key_before  # reseeding the new one only


def test_a_train_state_field_that_is_not_a_collection_is_kept_from_the_target():
  class WithKey(TrainState):
    dropout_rng: Any = None

  v = linen_variables()
  tx = optax.adam(1e-2)
  state = WithKey.create(apply_fn=None, params=v['params'], tx=tx, batch_stats=v['batch_stats'],
                         dropout_rng=jax.random.key_data(jax.random.key(5)))
  with pytest.raises(errors.StructureError, match=r'TrainState.dropout_rng: is not a collection, .*state.replace\(dropout_rng=None\)'):
    converters.linen_to_nnx(state, target=(NNXNet(nnx.Rngs(0)), None))
  model = NNXNet(nnx.Rngs(7))
  model, optimizer = converters.linen_to_nnx(
      state.replace(dropout_rng=None), target=(model, nnx.Optimizer(model, tx, wrt=nnx.Param))
  )
  back = converters.nnx_to_linen((model, optimizer), target=state)
  assert back.dropout_rng is state.dropout_rng
  abstract = jax.eval_shape(lambda: state)
  with pytest.raises(errors.StructureError, match="target.dropout_rng: is not a collection, so the output keeps the target's, but it is abstract"):
    converters.nnx_to_linen((model, optimizer), target=abstract)


def test_a_collection_must_be_a_dict_of_variables():
  with pytest.raises(errors.StructureError, match=r'ema: a collection is a dict of variables by path, not a ArrayImpl'):
    converters.linen_to_nnx({**linen_variables(), 'ema': jnp.zeros(3)}, collections={'ema': EMA})


def test_a_variable_of_a_type_registered_to_another_collection_is_refused():
  class Net(NNXNet):
    def __init__(self, rngs):
      super().__init__(rngs)
      self.dense.bias = nnx.LoRAParam(self.dense.bias[...])

  with pytest.raises(errors.StructureError, match="model/dense/bias: converted from the Linen 'params' collection"):
    converters.linen_to_nnx(linen_variables(), target=Net(nnx.Rngs(0)), collections={'lora': nnx.LoRAParam})


def test_a_catch_all_collection_does_not_swallow_intermediates():
  model = NNXNet(nnx.Rngs(7))
  model.dense.sown = nnx.Intermediate((X,))  # what sow() stores: a tuple
  with pytest.raises(errors.StructureError, match='model/dense/sown: is an nnx.Intermediate'):
    converters.nnx_to_linen(model, collections={'ema': nnx.Variable})


def test_an_empty_collection_of_the_target_stays_in_the_output():
  model = NNXNet(nnx.Rngs(7))
  nnx.update(model, converters.linen_to_nnx(linen_variables()))
  target = {**linen_variables(), 'cache': {}}
  assert converters.nnx_to_linen(model, target=target)['cache'] == {}


class StackedWithDropout(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.w = nnx.Param(jnp.zeros((2, OUT)))
    self.dropout = nnx.Dropout(0.5, rngs=rngs)


@pytest.mark.parametrize('rngs', [{'nope': 1}, True])
def test_malformed_seeds_are_refused_before_any_donated_input_is_deleted(rngs):
  layers = {f'Block_{i}': {'w': jnp.full((OUT,), float(i))} for i in range(2)}
  paths = converters.PathMapping([converters.PathRule('Block_{i}/w', 'layers/{i}/w', 'Blocks/w', 'w')])
  abstract = nnx.eval_shape(lambda: StackedWithDropout(nnx.Rngs(7)))
  with pytest.raises(errors.StructureError, match='rngs='):
    converters.linen_to_nnx({'params': layers}, target=abstract, paths=paths, scan=True, donate=True, rngs=rngs)
  assert not any(layer['w'].is_deleted() for layer in layers.values())
  model = converters.linen_to_nnx({'params': layers}, target=abstract, paths=paths, scan=True, donate=True, rngs=3)
  np.testing.assert_array_equal(model.w[...], np.stack([np.full((OUT,), float(i)) for i in range(2)]))
  assert all(layer['w'].is_deleted() for layer in layers.values())  # donated once every check passed
