"""`tracing.trace` records what a Linen model creates, where, and its calls."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax.core import scope as flax_scope

from converters.port import tracing
from tests.converters.port import linen_models


def test_records_each_module_its_site_and_its_calls():
  model = linen_models.stack(widths=(8, 12), features=5)
  root, variables = tracing.trace(model.module, *model.args, **model.kwargs)
  assert root.cls is linen_models.Stack and root.path == ()
  names = [c.name for c in root.children]
  assert names == ['Dense_0', 'Dense_1', 'norm', 'Dropout_0', 'head']
  dense_0, dense_1 = root.children[:2]
  # One expression in the loop created both: the same site, in the model's file.
  assert dense_0.site == dense_1.site
  assert dense_0.site.filename.endswith('linen_models.py')
  assert [c.args[0].shape for c in dense_0.calls] == [(4, 5)]
  assert [c.args[0].shape for c in dense_1.calls] == [(4, 8)]
  assert dense_1.calls[0].outputs.shape == (4, 12)
  assert set(variables) == {'params'}
  assert jax.tree.leaves(variables)  # abstract: nothing was computed


def test_the_model_is_not_changed_and_linen_is_restored():
  model = linen_models.stack()
  post_init, param = tracing.nn.Module.__post_init__, flax_scope.Scope.param
  before = model.module
  tracing.trace(model.module, *model.args, **model.kwargs)
  assert tracing.nn.Module.__post_init__ is post_init and flax_scope.Scope.param is param
  assert model.module is before and model.module.scope is None


_SEEN: list = []  # what `_InitializedInline` saw, in order


class _InitializedInline(nn.Module):
  """Records whether jit is disabled where its parameter is initialised
  and where its call runs."""

  @nn.compact
  def __call__(self, x):
    def init(key, shape):
      _SEEN.append(('init', jax.config.jax_disable_jit))
      return nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))(key, shape)

    kernel = self.param('kernel', init, (x.shape[-1], 3))
    _SEEN.append(('call', jax.config.jax_disable_jit))
    return nn.Dense(2)(x @ kernel)


def test_initializers_run_inline_and_the_rest_of_the_call_jitted():
  # (Inline, an initializer is traced into the model's trace, not into a
  # jaxpr of its own at each new shape: the port's traces are that cheaper.)
  _SEEN.clear()
  _, variables = tracing.trace(_InitializedInline(), jax.ShapeDtypeStruct((2, 5), 'float32'))
  assert _SEEN == [('init', True), ('call', False)]
  kernel = variables['params']['kernel']
  assert isinstance(kernel, nn.Partitioned) and kernel.names == (None, 'model')
  assert kernel.value.shape == (5, 3) and variables['params']['Dense_0']['kernel'].shape == (3, 2)
  assert not jax.config.jax_disable_jit


class _EveryInitializerKind(nn.Module):
  """Parameters of each of JAX's initializers, with and without a dtype,
  a factory's own default dtype, a Flax layer's `param_dtype`, and wrapped
  (`nn.with_partitioning`, `DenseGeneral`'s reshaping)."""

  @nn.compact
  def __call__(self, x):
    inits = nn.initializers
    w = self.param('lecun', inits.lecun_normal(), (x.shape[-1], 3), jnp.bfloat16)
    b = self.param('factory_dtype', inits.normal(0.02, dtype=jnp.bfloat16), (3,))
    u = self.param('uniform', inits.uniform(), (3,))
    t = self.param('truncated', inits.truncated_normal(dtype=jnp.float16), (1, 3))
    c = self.param('constant', inits.constant(2, dtype=jnp.int32), (3,))
    z = self.param('zeros', inits.zeros_init(), (3,), jnp.bfloat16)
    o = self.param('ones', jax.nn.initializers.ones, (2, 3))
    p = self.param('partitioned', nn.with_partitioning(inits.lecun_normal(), (None, 'model')), (3, 3), jnp.float16)
    y = (x @ w + b + u + t + c + z).sum(0) + o @ p
    y = nn.DenseGeneral((2, 2), kernel_init=inits.truncated_normal(dtype=jnp.bfloat16))(y)
    return nn.Dense(4, param_dtype=jnp.bfloat16)(y)


def test_jax_initializers_give_the_shape_and_dtype_flax_would():
  # (They give zeros without drawing: only a value's shape and dtype are
  # kept, and drawing at symbolic sizes is a third of a port's traces.)
  x = jax.ShapeDtypeStruct((2, 5), 'float32')
  _, variables = tracing.trace(_EveryInitializerKind(), x)
  expected = jax.eval_shape(_EveryInitializerKind().init, jax.random.key(0), x)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), variables) == jax.tree.map(
      lambda a: (a.shape, a.dtype), expected)
  assert isinstance(variables['params']['partitioned'], nn.Partitioned)


class _InitializedByAZeroLengthScan(nn.Module):
  """A parameter whose initializer scans over its (here empty) first axis:
  inline, `disable_jit` refuses a scan of no steps."""

  @nn.compact
  def __call__(self, x):
    def init(key, shape):
      _, rows = jax.lax.scan(lambda c, _: (c, jnp.zeros(shape[1:])), 0.0, None, length=shape[0])
      return rows

    return x + self.param('empty', init, (0, x.shape[-1])).sum(0)


def test_an_initializer_inline_code_refuses_runs_jitted_as_flax_runs_it():
  _, variables = tracing.trace(_InitializedByAZeroLengthScan(), jax.ShapeDtypeStruct((2, 5), 'float32'))
  assert variables['params']['empty'].shape == (0, 5)


def test_only_the_tracing_thread_runs_initializers_inline_and_flax_is_restored_once():
  param = flax_scope.Scope.param
  other_thread = []

  def init_elsewhere():
    _SEEN.clear()
    jax.eval_shape(_InitializedInline().init, jax.random.key(0), jax.ShapeDtypeStruct((2, 5), 'float32'))
    other_thread.extend(_SEEN)
    # (drawn, not the zeros a trace's draws give)
    other_thread.append(bool(jnp.any(nn.Dense(3).init(jax.random.key(0), jnp.ones((1, 4)))['params']['kernel'])))

  with tracing._initializers_under_trace(), tracing._initializers_under_trace():  # a trace within a trace
    thread = threading.Thread(target=init_elsewhere)
    thread.start()
    thread.join()
    assert other_thread == [('init', False), ('call', False), True]
  assert flax_scope.Scope.param is param


class _FailingInitializer(nn.Module):
  @nn.compact
  def __call__(self, x):
    def init(key, shape):
      raise ZeroDivisionError('the initializer broke')

    return x * self.param('w', init, (x.shape[-1],))


def test_linen_is_restored_after_an_initializer_fails_inline_and_jitted():
  param = flax_scope.Scope.param
  with pytest.raises(ZeroDivisionError, match='the initializer broke'):
    tracing.trace(_FailingInitializer(), jax.ShapeDtypeStruct((2, 5), 'float32'))
  assert flax_scope.Scope.param is param and not jax.config.jax_disable_jit


def test_linen_is_restored_after_a_trace_that_fails():
  post_init, param = tracing.nn.Module.__post_init__, flax_scope.Scope.param
  with pytest.raises(TypeError):
    tracing.trace(_InitializedInline(), jax.ShapeDtypeStruct((2, 5, 7), 'float32'), 'surplus')
  assert tracing.nn.Module.__post_init__ is post_init and flax_scope.Scope.param is param


def test_nested_user_modules_are_children_of_their_creator():
  model = linen_models.tower(depth=3)
  root, _ = tracing.trace(model.module, *model.args, **model.kwargs)
  residuals = [c for c in root.children if c.cls is linen_models.Residual]
  assert [r.path for r in residuals] == [('Residual_0',), ('Residual_1',), ('Residual_2',)]
  assert [c.path for c in residuals[1].children] == [
      ('Residual_1', 'Dense_0'), ('Residual_1', 'Dense_1')
  ]


def test_a_module_sharing_its_parents_scope_records_the_names_it_made():
  from tests.converters.port.golden import shared_scope

  model = shared_scope.model()
  root, variables = tracing.trace(model.module, *model.args, **model.kwargs)
  mlp = next(c for c in root.children if c.name == 'mlp')
  # `nn.share_scope(self, gating)`: the Einsums are at the feed-forward's
  # path, each with the parameter it made there.
  assert [(c.path, c.shares_scope, c.reserved) for c in mlp.children] == [
      (('mlp',), True, ['gating_einsum']), (('mlp',), True, ['linear'])]
  assert set(variables['params']['mlp']) == {'gating_einsum', 'linear'}
  assert not mlp.shares_scope and not root.shares_scope
