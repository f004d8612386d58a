"""Tests of `converters.testing.port`: the one-call checks pass on a true port and fail on a wrong one.

The model is small and not the kit's MLP: a Dense, a BatchNorm (so
`batch_stats` ride along) and dropout (so the NNX side has RNG state).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state

from converters import PathMapping, PathRule, Rearrange, linen_to_nnx
from converters.testing import assert_port_equivalent, assert_training_equivalent

IN, OUT = 3, 4


class LinenNet(nn.Module):
  epsilon: float = 1e-5
  train_dropout: bool = False  # False: its dropout never acts, as `deterministic=True` says

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(OUT, name='dense')(x)
    x = nn.BatchNorm(use_running_average=not train, epsilon=self.epsilon, name='norm')(x)
    return nn.Dropout(0.5, deterministic=not (train and self.train_dropout), name='dropout')(x)


class NNXNet(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, epsilon: float = 1e-5):
    self.dense = nnx.Linear(IN, OUT, rngs=rngs)
    self.norm = nnx.BatchNorm(OUT, epsilon=epsilon, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, deterministic=True, rngs=rngs)

  def __call__(self, x):
    return self.dropout(self.norm(self.dense(x)))


class TrainState(train_state.TrainState):
  batch_stats: Any = None


def batch(i: int):
  x = jnp.sin(jnp.arange(8.0 * IN).reshape(8, IN) + i)
  return x, jnp.cos(jnp.arange(8.0 * OUT).reshape(8, OUT) - i)


def variables():
  v = LinenNet().init(jax.random.key(0), batch(0)[0])
  _, updates = LinenNet().apply(v, batch(9)[0], train=True, mutable=['batch_stats'])
  return {'params': v['params'], **updates}


@pytest.mark.nightly  # CI: test_a_training_step_compares_the_batch_statistics_it_writes (the same pair passes, a training step too)
def test_a_true_port_passes():
  assert_port_equivalent(
      LinenNet(), variables(), NNXNet(nnx.Rngs(3)), batch(1)[0], linen_kwargs={'train': False}
  )


def test_a_port_that_computes_otherwise_fails_naming_outputs_and_gradients():
  with pytest.raises(AssertionError) as info:
    assert_port_equivalent(
        LinenNet(), variables(), NNXNet(nnx.Rngs(3), epsilon=1e-2), batch(1)[0],
        linen_kwargs={'train': False},
    )
  message = str(info.value)
  assert 'outputs' in message and 'gradients' in message and "['dense']['kernel']" in message


def test_a_tolerance_admits_what_it_says_and_no_more():
  args = (LinenNet(), variables(), NNXNet(nnx.Rngs(3), epsilon=1e-3), batch(1)[0])
  with pytest.raises(AssertionError, match='max abs diff'):
    assert_port_equivalent(*args, linen_kwargs={'train': False})
  assert_port_equivalent(*args, linen_kwargs={'train': False}, atol=1e-2)


class LinenKeywordNet(LinenNet):
  """Called with keywords, as Flax's examples call their models."""

  def __call__(self, *, x, train: bool = False):
    return super().__call__(x, train)


class NNXKeywordNet(NNXNet):
  def __call__(self, *, x):
    return super().__call__(x)


def test_keyword_inputs_are_inputs_of_both_calls():
  assert_port_equivalent(
      LinenKeywordNet(train_dropout=True), variables(), NNXKeywordNet(nnx.Rngs(3)), x=batch(1)[0], paths='infer',
      linen_kwargs={'train': False}, linen_train_kwargs={'train': True},
  )
  with pytest.raises(AssertionError, match='outputs'):
    assert_port_equivalent(
        LinenKeywordNet(), variables(), NNXKeywordNet(nnx.Rngs(3), epsilon=1e-2), x=batch(1)[0],
        linen_kwargs={'train': False},
    )


def linen_step(state, b):
  x, y = b

  def loss(params):
    out, updates = state.apply_fn(
        {'params': params, 'batch_stats': state.batch_stats}, x, train=True, mutable=['batch_stats']
    )
    return jnp.mean((out - y) ** 2), updates

  grads, updates = jax.grad(loss, has_aux=True)(state.params)
  return state.apply_gradients(grads=grads, batch_stats=updates['batch_stats'])


def nnx_step(model, optimizer, b, *, learn=True):
  x, y = b
  model.set_attributes(use_running_average=False)  # as Linen's train=True: batch statistics, no dropout
  grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
  if learn:
    optimizer.update(model, grads)


def training_case():
  tx = optax.adam(1e-2)
  v = variables()
  state = TrainState.create(apply_fn=LinenNet().apply, params=v['params'], tx=tx, batch_stats=v['batch_stats'])
  model = NNXNet(nnx.Rngs(5))
  return state, (model, nnx.Optimizer(model, tx, wrt=nnx.Param))


@pytest.mark.parametrize('k', [0, 2, 4])
def test_k_linen_steps_then_nnx_steps_equal_linen_steps(k):
  state, target = training_case()
  assert_training_equivalent(state, linen_step, target, nnx_step, [batch(i) for i in range(4)], k=k)


def test_an_nnx_step_that_does_not_learn_fails_naming_params_and_moments():
  state, target = training_case()
  frozen = lambda m, o, b: nnx_step(m, o, b, learn=False)
  with pytest.raises(AssertionError) as info:
    assert_training_equivalent(state, linen_step, target, frozen, [batch(i) for i in range(3)], k=1)
  message = str(info.value)
  assert ".params['dense']['kernel']" in message and '.opt_state[0].mu' in message


class NNXNetOtherTraining(NNXNet):
  """Alike in eval mode; dropout 0.1 and momentum 0.5 in training."""

  def __init__(self, rngs: nnx.Rngs):
    super().__init__(rngs)
    self.norm = nnx.BatchNorm(OUT, momentum=0.5, rngs=rngs)
    self.dropout = nnx.Dropout(0.1, deterministic=True, rngs=rngs)


def test_dropout_rate_and_momentum_that_only_training_uses_are_compared():
  with pytest.raises(AssertionError) as info:
    assert_port_equivalent(
        LinenNet(), variables(), NNXNetOtherTraining(nnx.Rngs(3)), batch(1)[0],
        linen_kwargs={'train': False},
    )
  message = str(info.value)
  assert 'Dropout rate' in message and 'Linen 0.5; NNX 0.1' in message
  assert 'BatchNorm momentum, axis_name' in message and 'Linen (0.99, None); NNX (0.5, None)' in message
  assert 'outputs' not in message  # alike in eval mode


class LinenReplicaNet(nn.Module):
  """Batch statistics averaged over the replicas of `batch`, as under pmap."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(OUT, name='dense')(x)
    return nn.BatchNorm(use_running_average=not train, axis_name='batch', name='norm')(x)


class NNXReplicaNet(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, axis_name: str | None = 'batch'):
    self.dense = nnx.Linear(IN, OUT, rngs=rngs)
    self.norm = nnx.BatchNorm(OUT, axis_name=axis_name, rngs=rngs)

  def __call__(self, x):
    return self.norm(self.dense(x))


def test_a_training_step_over_a_mapped_axis_runs_as_one_replica_of_it():
  linen_variables = LinenReplicaNet().init(jax.random.key(0), batch(0)[0])
  check = lambda model, **kwargs: assert_port_equivalent(
      LinenReplicaNet(), linen_variables, model, batch(1)[0],
      linen_kwargs={'train': False}, linen_train_kwargs={'train': True}, **kwargs)
  check(NNXReplicaNet(nnx.Rngs(0)), axis_name='batch')
  # Without the axis, Linen's step cannot run at all (as outside pmap).
  with pytest.raises(NameError, match='unbound axis name: batch'):
    check(NNXReplicaNet(nnx.Rngs(0)))
  # On one replica a port without the axis computes the same: its setting says.
  with pytest.raises(AssertionError, match=r"BatchNorm momentum, axis_name.*'batch'\).*None\)"):
    check(NNXReplicaNet(nnx.Rngs(0), axis_name=None), axis_name='batch')


class LinenNoisy(nn.Module):
  """Noise drawn by the module itself, from its `noise` stream."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(OUT, name='dense')(x + jax.random.normal(self.make_rng('noise'), x.shape))


class NNXNoisy(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, draws: int = 1):
    self.dense = nnx.Linear(IN, OUT, rngs=rngs)
    self.rngs = rngs
    self.draws = draws

  def __call__(self, x):
    for _ in range(self.draws):
      key = self.rngs.noise()
    return self.dense(x + jax.random.normal(key, x.shape))


def test_what_a_model_draws_itself_is_compared_from_the_same_keys():
  linen_variables = LinenNoisy().init({'params': jax.random.key(0), 'noise': jax.random.key(1)}, batch(0)[0])
  check = lambda model, **kwargs: assert_port_equivalent(
      LinenNoisy(), linen_variables, model, batch(1)[0], **kwargs)
  check(NNXNoisy(nnx.Rngs(0, noise=5)), drawn_streams=['noise'])
  # A port that draws its second key where Linen draws its first differs.
  with pytest.raises(AssertionError, match='outputs'):
    check(NNXNoisy(nnx.Rngs(0, noise=5), draws=2), drawn_streams=['noise'])
  # Unnamed, the streams the Linen call draws are found; named none, Linen
  # has no key to draw (as its apply without rngs).
  check(NNXNoisy(nnx.Rngs(0, noise=5)))
  with pytest.raises(Exception, match='needs PRNG for "noise"'):
    check(NNXNoisy(nnx.Rngs(0, noise=5)), drawn_streams=())


class LinenTwoDropouts(nn.Module):
  """Two dropouts and a draw of its own, in this order, all from `dropout`."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dropout(0.5, deterministic=False)(x)
    x = x + jax.random.normal(self.make_rng('dropout'), x.shape)
    return nn.Dropout(0.25, deterministic=False)(nn.Dense(OUT, name='dense')(x))


class NNXTwoDropouts(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, swapped: bool = False, fixed: bool = False):
    # Each nnx.Dropout forks a stream of its own from `rngs`.
    self.first = nnx.Dropout(0.5, rngs=rngs)
    self.dense = nnx.Linear(IN, OUT, rngs=rngs)
    self.second = nnx.Dropout(0.25, rngs=rngs)
    self.rngs = rngs
    self.swapped = swapped
    self.fixed = fixed  # the second dropout's keys from a seed of its own, the same at every call

  def __call__(self, x):
    # (Given at the call, as Linen's are: the checks run the port in eval mode.)
    if self.swapped:  # its own draw first: the dropout's key is Linen's second
      noise = jax.random.normal(self.rngs.dropout(), x.shape)
      x = self.first(x, deterministic=False) + noise
    else:
      x = self.first(x, deterministic=False)
      x = x + jax.random.normal(self.rngs.dropout(), x.shape)
    rngs = nnx.Rngs(dropout=0) if self.fixed else None
    return self.second(self.dense(x), deterministic=False, rngs=rngs)


def test_draws_from_streams_the_layers_fork_are_compared_in_the_order_of_the_call():
  linen_variables = LinenTwoDropouts().init({'params': jax.random.key(0), 'dropout': jax.random.key(1)}, batch(0)[0])
  check = lambda model: assert_port_equivalent(
      LinenTwoDropouts(), linen_variables, model, batch(1)[0], drawn_streams=['dropout'])
  check(NNXTwoDropouts(nnx.Rngs(0, dropout=5)))
  with pytest.raises(AssertionError, match='outputs'):
    check(NNXTwoDropouts(nnx.Rngs(0, dropout=5), swapped=True))
  # Keys the model does not hold are not given Linen's: a port ignoring its Rngs fails.
  with pytest.raises(AssertionError, match='outputs'):
    check(NNXTwoDropouts(nnx.Rngs(0, dropout=5), fixed=True))


class LinenDecoder(nn.Module):
  """A decode step: each call appends its input to a cache and reads it all."""

  @nn.compact
  def __call__(self, x):
    cache = self.variable('cache', 'keys', jnp.zeros, (4, IN))
    index = self.variable('cache', 'index', lambda: jnp.array(0, jnp.int32))
    cache.value = jax.lax.dynamic_update_slice(cache.value, x, (index.value, 0))
    index.value = index.value + 1
    return nn.Dense(OUT, name='dense')(jnp.sum(cache.value, axis=0, keepdims=True))


class NNXDecoder(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, step: int = 1):
    self.keys = nnx.Cache(jnp.zeros((4, IN)))
    self.index = nnx.Cache(jnp.array(0, jnp.int32))
    self.dense = nnx.Linear(IN, OUT, rngs=rngs)
    self.step = step

  def __call__(self, x):
    self.keys[...] = jax.lax.dynamic_update_slice(self.keys[...], x, (self.index[...], 0))
    self.index[...] = self.index[...] + self.step
    return self.dense(jnp.sum(self.keys[...], axis=0, keepdims=True))


def test_a_decode_step_compares_the_cache_it_writes():
  x = batch(1)[0][:1]
  v = LinenDecoder().init(jax.random.key(0), x)
  v = {'params': v['params'], 'cache': LinenDecoder().apply(v, x + 1, mutable=['cache'])[1]['cache']}
  assert_port_equivalent(LinenDecoder(), v, NNXDecoder(nnx.Rngs(3)), x)  # paths kept
  # The index advances by two: this step's output is alike, the cache is not.
  with pytest.raises(AssertionError, match='variables the call writes') as info:
    assert_port_equivalent(LinenDecoder(), v, NNXDecoder(nnx.Rngs(3), step=2), x)
  assert "['index']" in str(info.value) and "['keys']" not in str(info.value)


class NNXNetOtherMomentumNoSettingsCheck(NNXNet):
  """Momentum 0.5: alike in eval mode, not after one training step."""

  def __init__(self, rngs: nnx.Rngs):
    super().__init__(rngs)
    self.norm = nnx.BatchNorm(OUT, momentum=0.5, rngs=rngs)


def test_a_training_step_compares_the_batch_statistics_it_writes():
  args = (LinenNet(train_dropout=True), variables(), NNXNet(nnx.Rngs(3)), batch(1)[0])
  train = {'linen_kwargs': {'train': False}, 'linen_train_kwargs': {'train': True}}
  assert_port_equivalent(*args, **train)  # dropout 0.5 on both sides, drawn alike
  with pytest.raises(AssertionError) as info:
    assert_port_equivalent(*args[:2], NNXNetOtherMomentumNoSettingsCheck(nnx.Rngs(3)), args[3], **train)
  message = str(info.value)
  assert 'what a training step writes' in message and "['norm']['mean']" in message


def test_a_dropout_the_original_never_applies_differs_once_the_port_trains():
  # `model.train()` turns on every NNX Dropout, one built deterministic too;
  # Linen's `deterministic=True` holds in training.
  with pytest.raises(AssertionError, match='train-mode outputs'):
    assert_port_equivalent(
        LinenNet(), variables(), NNXNet(nnx.Rngs(3)), batch(1)[0],
        linen_kwargs={'train': False}, linen_train_kwargs={'train': True},
    )


class LinenDropoutMLP(nn.Module):
  """Dropout after the hidden layer, shared over the batch, and again after the middle one."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.relu(nn.Dense(8, name='hidden')(x))
    h = nn.Dropout(0.5, broadcast_dims=(0,), deterministic=not train)(h)
    h = nn.Dropout(0.5, deterministic=not train)(nn.Dense(8, name='middle')(h))
    return nn.Dense(OUT, name='out')(h)


class NNXDropoutMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, variant: str = 'true'):
    self.hidden = nnx.Linear(IN, 8, rngs=rngs)
    self.middle = nnx.Linear(8, 8, rngs=rngs)
    self.out = nnx.Linear(8, OUT, rngs=rngs)
    self.first = nnx.Dropout(0.5, broadcast_dims=() if variant == 'no_broadcast' else (0,), rngs=rngs)
    self.second = nnx.Dropout(0.5, rngs=rngs)
    self.variant = variant

  def __call__(self, x):
    if self.variant == 'on_the_input':
      h = nnx.relu(self.hidden(self.first(x)))
    else:
      h = self.first(nnx.relu(self.hidden(x)))
    h = self.middle(h)
    return self.out(h if self.variant == 'one_dropout' else self.second(h))


@pytest.mark.parametrize('variant', ['on_the_input', 'no_broadcast', 'one_dropout'])
def test_where_dropout_acts_is_compared_by_its_effect_in_a_training_step(variant):
  linen_variables = LinenDropoutMLP().init(jax.random.key(0), batch(0)[0])
  check = lambda model: assert_port_equivalent(
      LinenDropoutMLP(), linen_variables, model, batch(1)[0],
      linen_kwargs={'train': False}, linen_train_kwargs={'train': True})
  check(NNXDropoutMLP(nnx.Rngs(3)))
  # The same rates as a set, alike in eval mode: only training tells.
  with pytest.raises(AssertionError, match='train-mode outputs'):
    check(NNXDropoutMLP(nnx.Rngs(3), variant))


class LinenFieldMode(nn.Module):
  """Its field sets its mode (Flax's sst2 `deterministic`): a draw of its
  own and a dropout in training, then a `lax.scan` of no variables."""

  deterministic: bool = True

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(OUT, name='dense')(x)
    if not self.deterministic:
      x = x + jax.random.normal(self.make_rng('noise'), x.shape)
    x = nn.Dropout(0.5)(x, deterministic=self.deterministic)
    return jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=2)[0]


class NNXFieldMode(nnx.Module):
  """The port: `deterministic` is what `.train()` / `.eval()` set."""

  def __init__(self, rngs: nnx.Rngs, deterministic: bool = True, draws_in_eval: bool = False):
    self.dense = nnx.Linear(IN, OUT, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.deterministic = deterministic
    self.draws_in_eval = draws_in_eval
    self.rngs = rngs

  def __call__(self, x):
    x = self.dense(x)
    if not self.deterministic:
      noise = jax.random.normal(self.rngs.noise(), x.shape)
      x = x + (2 * noise if self.draws_in_eval else noise)  # (a bug only training shows)
    x = self.dropout(x, deterministic=self.deterministic)  # given at its call, as Linen's is
    return jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=2)[0]


def test_a_model_whose_field_sets_its_mode_is_trained_as_its_train_module():
  linen_variables = LinenFieldMode().init(jax.random.key(0), batch(0)[0])
  check = lambda model, **kwargs: assert_port_equivalent(
      LinenFieldMode(), linen_variables, model, batch(1)[0], **kwargs)
  train = {'linen_train_module': LinenFieldMode(deterministic=False)}
  # Around a scan, Flax's dropout is left out of the step on both sides (the
  # port's though it is told `deterministic=False` at its call) and the
  # model's own draw is still drawn alike.
  check(NNXFieldMode(nnx.Rngs(0, noise=1)), **train)
  wrong = NNXFieldMode(nnx.Rngs(0, noise=1), draws_in_eval=True)
  check(wrong)  # eval mode alone does not tell
  with pytest.raises(AssertionError, match='train-mode outputs'):
    check(wrong, **train)


class LinenAttentionMode(nn.Module):
  """Attention told its mode at its call by a field, a draw of its own
  after it, then a `lax.scan` of no variables."""

  deterministic: bool = True

  @nn.compact
  def __call__(self, x):
    x = nn.MultiHeadDotProductAttention(num_heads=2, dropout_rate=0.5, name='attn')(
        x, x, deterministic=self.deterministic)
    if not self.deterministic:
      x = x + jax.random.normal(self.make_rng('noise'), x.shape)
    return jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=2)[0]


class NNXAttentionMode(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, deterministic: bool = True, rate: float = 0.5):
    self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=OUT, dropout_rate=rate,
                                       decode=False, rngs=rngs)
    self.deterministic = deterministic
    self.rngs = rngs

  def __call__(self, x):
    x = self.attn(x, x, deterministic=self.deterministic)  # at its call, as Linen's is
    if not self.deterministic:
      x = x + jax.random.normal(self.rngs.noise(), x.shape)
    return jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=2)[0]


class LinenNeverDropping(LinenAttentionMode):
  """Its attention and dropout told `deterministic=True` at their calls,
  in training too: their rates never act."""

  @nn.compact
  def __call__(self, x):
    x = nn.MultiHeadDotProductAttention(num_heads=2, dropout_rate=0.5, name='attn')(x, x, deterministic=True)
    x = nn.Dropout(0.5)(x, deterministic=True)
    if not self.deterministic:
      x = x + jax.random.normal(self.make_rng('noise'), x.shape)
    return jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=2)[0]


class NNXDropping(NNXAttentionMode):
  """Its attention and dropout act in training: the rates alike, the modes not."""

  def __init__(self, rngs: nnx.Rngs, kind: str):
    super().__init__(rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.kind = kind

  def __call__(self, x):
    x = self.attn(x, x, deterministic=self.deterministic if self.kind == 'attention' else True)
    x = self.dropout(x, deterministic=self.deterministic if self.kind == 'dropout' else True)
    if not self.deterministic:
      x = x + jax.random.normal(self.rngs.noise(), x.shape)
    return jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None, length=2)[0]


@pytest.mark.parametrize('kind', ['attention', 'dropout'])
def test_dropout_acting_only_in_the_port_is_refused_around_a_scan(kind):
  # Around a scan the step leaves Flax's dropout out on both sides: which
  # layers act in training is compared apart, or this port would be proven.
  x = jnp.sin(jnp.arange(2.0 * 3 * OUT)).reshape(2, 3, OUT)
  linen_variables = LinenNeverDropping().init(jax.random.key(0), x)
  with pytest.raises(AssertionError, match=f'{kind.capitalize() if kind == "dropout" else kind} acting in training'):
    assert_port_equivalent(LinenNeverDropping(), linen_variables, NNXDropping(nnx.Rngs(0, noise=1), kind), x,
                           atol=1e-5, linen_train_module=LinenNeverDropping(deterministic=False))


def test_attention_told_its_mode_at_its_call_trains_without_dropout_around_a_scan():
  x = jnp.sin(jnp.arange(2.0 * 3 * OUT)).reshape(2, 3, OUT)
  linen_variables = LinenAttentionMode().init(jax.random.key(0), x)
  check = lambda model: assert_port_equivalent(
      LinenAttentionMode(), linen_variables, model, x, atol=1e-5,
      linen_train_module=LinenAttentionMode(deterministic=False))
  # The port's attention is told `deterministic=False` at its call: its
  # dropout is left out all the same, and draws no key the noise would miss.
  check(NNXAttentionMode(nnx.Rngs(0, noise=1)))
  with pytest.raises(AssertionError, match='attention dropout_rate'):
    check(NNXAttentionMode(nnx.Rngs(0, noise=1), rate=0.25))


class LinenSharded(nn.Module):
  @nn.compact
  def __call__(self, x):
    kernel = self.param('kernel', nn.with_partitioning(nn.initializers.normal(), ('data', 'model')), (8, 16))
    return x @ kernel


class NNXShardedOutIn(nnx.Module):
  """The kernel stored `(out, in)`, sharded to match."""

  def __init__(self, rngs: nnx.Rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (16, 8)), out_sharding=('model', 'data'))

  def __call__(self, x):
    return x @ self.w[...].T


def test_a_rule_with_a_transform_is_checked_on_a_mesh():
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  paths = PathMapping([PathRule('kernel', 'w', transform=Rearrange('i o -> o i'))])
  with jax.set_mesh(mesh):
    x = jnp.sin(jnp.arange(32.0).reshape(4, 8))
    linen_variables = jax.jit(LinenSharded().init)(jax.random.key(0), x)
    # The gradients, bare and placed sharded, convert through the rule's transform too.
    assert_port_equivalent(LinenSharded(), linen_variables, NNXShardedOutIn(nnx.Rngs(0)), x, paths=paths)


class LinenDropoutBlock(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.Dropout(0.5, deterministic=not train)(nn.relu(nn.Dense(8, name='up')(x)))
    return nn.Dense(OUT, name='down')(h)


class NNXRematBlock(nnx.Module):
  """The block under `nnx.remat`, which merges the model's streams anew inside."""

  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(IN, 8, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.down = nnx.Linear(8, OUT, rngs=rngs)

  def __call__(self, x):
    return nnx.remat(lambda m, x: m.down(m.drop(nnx.relu(m.up(x)))))(self, x)


@pytest.mark.nightly  # CI: test_a_transformed_method_traced_again_from_jaxs_cache_draws_in_order[NNXScaledRemat] (dropout drawn inside nnx.remat)
def test_draws_inside_an_nnx_transform_are_the_models_own():
  linen_variables = LinenDropoutBlock().init(jax.random.key(0), batch(0)[0])
  assert_port_equivalent(
      LinenDropoutBlock(), linen_variables, NNXRematBlock(nnx.Rngs(3)), batch(1)[0], paths='infer',
      linen_kwargs={'train': False}, linen_train_kwargs={'train': True})


class LinenNoiseEveryCall(nn.Module):
  """Noise of its own on every call, eval mode included."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(OUT, name='dense')(x)
    return h + 0.1 * jax.random.normal(self.make_rng('noise'), h.shape)


class NNXNoiseEveryCall(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.dense, self.rngs = nnx.Linear(IN, OUT, rngs=rngs), rngs

  def __call__(self, x):
    h = self.dense(x)
    return h + 0.1 * jax.random.normal(self.rngs.noise(), h.shape)


@pytest.mark.nightly  # CI: test_what_a_model_draws_itself_is_compared_from_the_same_keys draws unnamed too
def test_every_stream_the_linen_call_draws_is_drawn_alike_without_being_named():
  x = batch(1)[0]
  variables = LinenNoiseEveryCall().init({'params': jax.random.key(0), 'noise': jax.random.key(1)}, x)
  assert_port_equivalent(LinenNoiseEveryCall(), variables, NNXNoiseEveryCall(nnx.Rngs(0, noise=5)), x)
  assert_port_equivalent(LinenNoiseEveryCall(), variables, NNXNoiseEveryCall(nnx.Rngs(0, noise=5)), x, paths='infer')


class LinenDropoutsTwice(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.Dropout(0.5, deterministic=not train)(nn.Dense(OUT, name='dense')(x))
    return nn.Dropout(0.5, deterministic=not train)(h)


class NNXOneKeySplit(nnx.Module):
  """Both dropouts from one key split in two: Linen draws a key for each."""

  def __init__(self, rngs: nnx.Rngs):
    self.dense, self.rngs = nnx.Linear(IN, OUT, rngs=rngs), rngs
    self.first, self.second = nnx.Dropout(0.5, rngs=rngs), nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    first, second = jax.random.split(self.rngs.dropout())
    return self.second(self.first(self.dense(x), rngs=first), rngs=second)


def test_a_port_drawing_its_keys_otherwise_fails_the_training_step_saying_so():
  x = batch(1)[0]
  variables = LinenDropoutsTwice().init(jax.random.key(0), x)
  with pytest.raises(AssertionError, match='agree in eval mode but not in a training step') as info:
    assert_port_equivalent(LinenDropoutsTwice(), variables, NNXOneKeySplit(nnx.Rngs(0)), x,
                           linen_kwargs={'train': False}, linen_train_kwargs={'train': True})
  assert 'one key split in two' in str(info.value) and 'train-mode outputs' in str(info.value)


WIDE = 16  # features enough that dropout after a ReLU, three times, leaves some
_WIDE_X = jnp.sin(jnp.arange(8.0 * WIDE).reshape(8, WIDE))


class LinenDropBlock(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    return nn.Dropout(0.1)(nn.relu(nn.Dense(x.shape[-1])(x)), deterministic)


class LinenScaled(nn.Module):
  """Under `nn.remat`, which Linen traces anew at every call."""

  @functools.partial(nn.remat, static_argnums=(2,), prevent_cse=False)
  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    return nn.Dropout(0.1)(nn.Dense(x.shape[-1])(x), deterministic)


class LinenEncoder(nn.Module):
  depth: int = 2

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    for i in range(self.depth):
      x = LinenDropBlock(name=f'block_{i}')(x, deterministic)
    return LinenScaled(name='scaled')(x, deterministic)


class LinenScaledTwice(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    return LinenScaled(name='b')(LinenScaled(name='a')(x, deterministic), deterministic)


class NNXDropBlock(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.dense, self.drop = nnx.Linear(WIDE, WIDE, rngs=rngs), nnx.Dropout(0.1, rngs=rngs)

  def __call__(self, x):
    return self.drop(nnx.relu(self.dense(x)))


class NNXScaledRemat(nnx.Module):
  """Its call under `nnx.remat` at class level: one function for JAX to
  trace, whose trace JAX takes from its cache when called alike again."""

  def __init__(self, rngs: nnx.Rngs):
    self.dense, self.drop = nnx.Linear(WIDE, WIDE, rngs=rngs), nnx.Dropout(0.1, rngs=rngs)

  @nnx.remat(prevent_cse=False)
  def __call__(self, x):
    return self.drop(self.dense(x))


class NNXScaledJit(NNXScaledRemat):
  @nnx.jit
  def __call__(self, x):
    return self.drop(self.dense(x))


class NNXEncoder(nnx.Module):
  def __init__(self, depth: int, scaled: type, rngs: nnx.Rngs):
    self.blocks = nnx.List([NNXDropBlock(rngs) for _ in range(depth)])
    self.scaled = scaled(rngs)

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return self.scaled(x)


class NNXEncoderOtherOrder(NNXEncoder):
  """The blocks' keys drawn last block first: as many draws, another order."""

  def __call__(self, x):
    keys = [block.drop.rngs() for block in reversed(self.blocks)][::-1]
    for block, key in zip(self.blocks, keys):
      x = block.drop(nnx.relu(block.dense(x)), rngs=key)
    return self.scaled(x)


class NNXScaledTwice(nnx.Module):
  def __init__(self, scaled: type, rngs: nnx.Rngs):
    self.a, self.b = scaled(rngs), scaled(rngs)

  def __call__(self, x):
    return self.b(self.a(x))


class NNXScaledTwiceDrawingFirst(NNXScaledTwice):
  """A key of its own drawn before the calls: every later key one on."""

  def __call__(self, x):
    self.a.drop.rngs()
    return self.b(self.a(x))


_DEPTHS = PathMapping([
    *(PathRule(f'block_{{i}}/Dense_0/{p}', f'blocks/{{i}}/dense/{p}') for p in ('kernel', 'bias')),
    *(PathRule(f'scaled/Dense_0/{p}', f'scaled/dense/{p}') for p in ('kernel', 'bias')),
])
_TWICE = PathMapping([PathRule(f'{n}/Dense_0/{p}', f'{n}/dense/{p}') for n in 'ab' for p in ('kernel', 'bias')])
_DETERMINISTIC = {'linen_kwargs': {'deterministic': True}, 'linen_train_kwargs': {'deterministic': False}}


def _check_encoder(depth: int, port: type, scaled: type):
  x = _WIDE_X
  variables = LinenEncoder(depth).init(jax.random.key(0), x)
  assert_port_equivalent(LinenEncoder(depth), variables, port(depth, scaled, nnx.Rngs(3)), x,
                         paths=_DEPTHS, **_DETERMINISTIC)


def _check_twice(port: type, scaled: type):
  x = _WIDE_X
  variables = LinenScaledTwice().init(jax.random.key(0), x)
  assert_port_equivalent(LinenScaledTwice(), variables, port(scaled, nnx.Rngs(3)), x, paths=_TWICE, **_DETERMINISTIC)


@pytest.mark.parametrize('scaled', [NNXScaledRemat, NNXScaledJit])
def test_a_transformed_method_traced_again_from_jaxs_cache_draws_in_order(scaled):
  # Depth 3 after depth 2: `scaled`'s call traced with the same shapes, from
  # the cache, its draw the third of the call where it was the second.
  _check_encoder(2, NNXEncoder, scaled)
  _check_encoder(3, NNXEncoder, scaled)


@pytest.mark.parametrize('scaled', [NNXScaledRemat, NNXScaledJit])
def test_two_calls_of_one_transformed_method_in_a_call_draw_in_order(scaled):
  _check_twice(NNXScaledTwice, scaled)  # the second call traced from the cache


@pytest.mark.parametrize('scaled', [NNXScaledRemat, NNXScaledJit])
def test_a_port_drawing_in_another_order_through_a_transformed_method_fails(scaled):
  with pytest.raises(AssertionError, match='agree in eval mode but not in a training step'):
    _check_encoder(2, NNXEncoderOtherOrder, scaled)
  with pytest.raises(AssertionError, match='agree in eval mode but not in a training step'):
    _check_twice(NNXScaledTwiceDrawingFirst, scaled)


class LinenShift(nn.Module):
  """No parameters: a statistic it adds."""

  @nn.compact
  def __call__(self, x):
    return x + self.variable('batch_stats', 'shift', jnp.ones, (x.shape[-1],)).value


class NNXShift(nnx.Module):
  def __init__(self, shift: float = 1.0):
    self.shift = nnx.BatchStat(jnp.full((3,), shift))

  def __call__(self, x):
    return x + self.shift[...]


def test_a_model_without_parameters_is_compared_by_its_outputs():
  x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
  variables = LinenShift().init(jax.random.key(0), x)
  paths = PathMapping([PathRule('shift', 'shift')])
  assert_port_equivalent(LinenShift(), variables, NNXShift(), x, paths=paths)
  with pytest.raises(AssertionError, match='outputs'):
    # (The conversion gives it Linen's shift: a port adding it twice differs.)
    class Twice(NNXShift):
      def __call__(self, x):
        return x + 2 * self.shift[...]
    assert_port_equivalent(LinenShift(), variables, Twice(), x, paths=paths)


class _Doubles(nn.Module):
  @nn.compact
  def __call__(self, x):
    return 2 * x


class _DoublesPort(nnx.Module):
  def __init__(self, extra: bool, rngs: nnx.Rngs):
    self.extra = nnx.Linear(3, 3, rngs=rngs) if extra else nnx.data(None)

  def __call__(self, x):
    return 2 * x if self.extra is None else self.extra(x)


def test_a_model_of_no_variables_is_compared_by_its_outputs_and_a_port_holding_some_is_refused():
  x = jnp.arange(6.0).reshape(2, 3)
  linen_variables = _Doubles().init(jax.random.key(0), x)
  assert not jax.tree.leaves(linen_variables)
  assert_port_equivalent(_Doubles(), linen_variables, _DoublesPort(False, nnx.Rngs(0)), x, paths=PathMapping([]))
  with pytest.raises(AssertionError, match='Linen makes no variable, but the port holds parameters'):
    assert_port_equivalent(_Doubles(), linen_variables, _DoublesPort(True, nnx.Rngs(0)), x, paths=PathMapping([]))


class LinenResidual(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    return x + nn.Dropout(0.1)(nn.relu(nn.Dense(x.shape[-1])(x)), deterministic), None


class LinenScannedRemat(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    block = nn.remat(LinenResidual, static_argnums=(2,))
    x, _ = nn.scan(block, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                   in_axes=nn.broadcast, length=2)(name='blocks')(x, deterministic)
    return x


class NNXResidual(nnx.Module):
  def __init__(self, width: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(width, width, rngs=rngs)
    self.dropout = nnx.Dropout(0.1, rngs=rngs)

  def __call__(self, x):
    return x + self.dropout(nnx.relu(self.dense(x)))


class NNXScannedRemat(nnx.Module):
  def __init__(self, width: int, rngs: nnx.Rngs):
    @nnx.split_rngs(splits=2)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs: nnx.Rngs):
      return NNXResidual(width, rngs)

    self.blocks = create(rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    @nnx.remat
    def run(x, block):
      return block(x)

    return run(x, self.blocks)


_SCANNED = PathMapping([PathRule(f'blocks/Dense_0/{p}', f'blocks/dense/{p}') for p in ('kernel', 'bias')])


def _scanned_remat(width: int):
  x = jax.random.normal(jax.random.key(width), (2, width))
  variables = LinenScannedRemat().init(jax.random.key(0), x)
  return x, variables, linen_to_nnx(variables, target=NNXScannedRemat(width, nnx.Rngs(0)), paths=_SCANNED)


@pytest.mark.nightly  # a watch on XLA; CI checks the workaround at width 7 (below)
def test_xla_still_rounds_a_scans_product_by_what_else_its_program_returns():
  # What `_compare_call` works around: the port's program returning its
  # state besides its outputs computes the outputs a few ulp off Linen's,
  # the same program returning its outputs alone does not. When this fails,
  # XLA no longer does and the second comparison can go.
  x, variables, model = _scanned_remat(7)
  model.eval()
  graphdef, state = nnx.split(model)
  linen = jax.jit(lambda v, x: LinenScannedRemat().apply(v, x))(variables, x)

  def nnx_side(state, x, with_state: bool):
    held = nnx.merge(graphdef, state)
    return (held(x), nnx.state(held)) if with_state else (held(x),)

  alone = jax.jit(functools.partial(nnx_side, with_state=False))(state, x)[0]
  with_state = jax.jit(functools.partial(nnx_side, with_state=True))(state, x)[0]
  assert bool(jnp.all(alone == linen))
  assert not bool(jnp.all(with_state == linen))


# Width 7 first (CI's case): there XLA rounds otherwise, so the workaround acts.
@pytest.mark.parametrize('width', [7, 6, 8])
def test_a_scanned_remat_port_is_equal_bit_for_bit_whatever_its_program_returns(width):
  x, variables, model = _scanned_remat(width)
  assert_port_equivalent(LinenScannedRemat(), variables, model, x, paths=_SCANNED, **_DETERMINISTIC)


class NNXResidualOff(NNXResidual):
  """An ulp or two off, as the program's rounding is: still not a port."""

  def __call__(self, x):
    return super().__call__(x) * (1 + 2**-22)


def test_a_scanned_remat_port_off_by_an_ulp_is_still_refused(monkeypatch):
  # Width 7, where the workaround compares the outputs again (CI's case of
  # the test above): its second comparison refuses the port too.
  x, variables, _ = _scanned_remat(7)
  monkeypatch.setattr(sys.modules[__name__], 'NNXResidual', NNXResidualOff)
  _, _, off = _scanned_remat(7)
  with pytest.raises(AssertionError, match='outputs'):
    assert_port_equivalent(LinenScannedRemat(), variables, off, x, paths=_SCANNED, **_DETERMINISTIC)


class LinenCounting(nn.Module):
  """Returns the count of its calls before this one, and counts this one."""

  @nn.compact
  def __call__(self, x):
    count = self.variable('batch_stats', 'count', lambda: jnp.zeros((), jnp.int32))
    position = count.value
    if not self.is_initializing():
      count.value += 1
    return nn.Dense(3, name='dense')(x), position


class NNXCounting(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, behind: int = 0):
    self.dense = nnx.Linear(3, 3, rngs=rngs)
    self.count = nnx.BatchStat(jnp.zeros((), jnp.int32))
    self.behind = behind

  def __call__(self, x):
    position = self.count[...] - self.behind
    self.count[...] += 1
    return self.dense(x), position


def test_outputs_compared_again_alone_are_computed_from_the_state_before_the_call():
  # A port off by exactly one update of its state: the outputs compared
  # again (programs returning them alone) must start where the first did.
  x = jnp.ones((2, 3))
  variables = LinenCounting().init(jax.random.key(0), x)
  paths = PathMapping([PathRule('dense/kernel', 'dense/kernel'), PathRule('dense/bias', 'dense/bias'),
                       PathRule('count', 'count')])
  assert_port_equivalent(LinenCounting(), variables, NNXCounting(nnx.Rngs(0)), x, paths=paths,
                         linen_train_kwargs={})
  with pytest.raises(AssertionError, match='outputs'):
    assert_port_equivalent(LinenCounting(), variables, NNXCounting(nnx.Rngs(0), behind=1), x, paths=paths,
                           linen_train_kwargs={})
