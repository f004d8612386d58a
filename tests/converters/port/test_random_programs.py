"""The property of `linen-nnx port`: a port handed over as proven is right at
configurations it never saw.

Random Linen programs (`random_programs`) are written as module files and
ported at one configuration. Where the port says proven, the test draws
other configurations and checks the port there against Linen on its own:
the written class built with that configuration, the Linen variables
converted through the written `PATHS` (so `PATHS` is checked by what the
models compute, not through itself), then outputs, input gradients, the
outputs in training (dropout masks drawn alike by call order:
`call_order_masks`, nothing of the kit's key alignment) and after one SGD
step in training, all bit for bit: both sides run the same operations
eagerly. At a configuration that takes a branch the port reports it does
not write (`PortResult.branches`), the port must refuse, raising
`NotImplementedError` that names it. A port not proven is counted
(`event`), never checked.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from converters import LinenModel, linen_to_nnx
from converters.port import emit, generate, port
from converters.port.prove import import_file, paths_file, port_paths
from tests.converters.inference.call_order_masks import masks_in_call_order
from tests.converters.port import random_programs
from tests.converters.port.random_programs import Program
from tests.hypothesis_profiles import PROFILE, compiling

_names = itertools.count()

#: A loop over widths, dropout, a config object, a layer's flag, a string
#: picking code, layers Linen numbers after the loop's: what CI checks.
EVERY_KIND_OF_FIELD = Program(('loop', 'dropout', 'config', 'dense', 'switch'), 'nn.tanh')
#: Nightly besides: the port guide's MLP (the head after the loop), and a
#: flag that adds a layer with a width read from the input.
GUIDE_MLP = Program(('loop', 'dropout'), 'nn.relu')
FLAGS_AND_CONFIG = Program(('config', 'norm', 'residual', 'dense', 'switch'), 'nn.tanh')


def _linen_module(module, configuration: dict):
  fields = {f: v for f, v in configuration.items() if f != 'in_features'}
  if 'config' in fields:
    fields['config'] = module.Config(**fields['config'])
  return module.Model(**fields), fields


def _nnx_model(generated, fields: dict, in_features: int, batch: int) -> nnx.Module:
  """The written class at `fields`, its sizes given as the port's constructor names them."""
  arguments = {}
  for name, parameter in list(inspect.signature(generated.Model.__init__).parameters.items())[1:]:
    if name in fields:
      arguments[name] = fields[name]
    elif name == 'in_features':
      arguments[name] = in_features
    elif name == 'x_shape':  # one example's shape
      arguments[name] = (in_features,)
    elif name == 'x_shape_with_batch':
      arguments[name] = (batch, in_features)
    elif name == 'rngs':
      arguments[name] = nnx.Rngs(0)
    elif parameter.default is inspect.Parameter.empty:
      raise AssertionError(f'the port takes {name}=, which this test does not know how to give')
  return generated.Model(**arguments)


def _equal(what: str, nnx_value, linen_value, configuration: dict) -> None:
  np.testing.assert_array_equal(
      np.asarray(nnx_value), np.asarray(linen_value),
      err_msg=f'proven port, wrong {what} at {configuration}',
  )


def _taken(branches, module, linen) -> list:
  """The reported branches the port writes to raise (`PortResult.branches`)
  that `linen` takes: each one's `if` test read with `linen` as `self`."""
  # (A random program is one class whose `if`s nest in none.)
  assert all(branch.cls == 'Model' for branch in branches), branches
  return [branch for branch in branches
          if bool(eval(branch.test, vars(module), {'self': linen})) != branch.is_else]  # the program's own test


def check_port_at(program: Program, module, generated, configuration: dict, branches=()) -> None:
  """The port against Linen at `configuration`, on their own; where Linen
  takes one of the `branches` the port reports it does not write, the port
  must refuse, raising `NotImplementedError` that names that branch."""
  linen, fields = _linen_module(module, configuration)
  taken = _taken(branches, module, linen)
  if taken:
    with pytest.raises(NotImplementedError) as refusal:
      _nnx_model(generated, fields, configuration['in_features'], 2)(jnp.ones((2, configuration['in_features'])))
    assert any(f'`if {b.test}`' in str(refusal.value) for b in taken), (str(refusal.value), taken)
    event('refused at a configuration that takes a branch it reports unwritten')
    return
  batch, in_features = 2, configuration['in_features']
  x = jax.random.normal(jax.random.key(1), (batch, in_features))
  other = jax.random.normal(jax.random.key(2), (batch, in_features))
  evaluating = {'train': False} if program.trains else {}
  variables = linen.init(jax.random.key(0), x, **evaluating)
  model = linen_to_nnx(variables, target=_nnx_model(generated, fields, in_features, batch), paths=port_paths(generated))
  model.eval()
  expected = linen.apply(variables, x, **evaluating)
  _equal('outputs', model(x), expected, configuration)
  weights = jax.random.normal(jax.random.key(3), expected.shape)
  _equal(
      'input gradients',
      jax.grad(lambda x: jnp.sum(model(x) * weights))(x),
      jax.grad(lambda x: jnp.sum(linen.apply(variables, x, **evaluating) * weights))(x),
      configuration,
  )
  training = {'train': True, 'rngs': {'dropout': jax.random.key(4)}} if program.trains else {}
  model.train()
  with masks_in_call_order():
    linen_out = linen.apply(variables, x, **training)
  with masks_in_call_order():
    nnx_out = model(x)
  _equal('outputs in training', nnx_out, linen_out, configuration)

  # One SGD step in training on each side, then the outputs on another input.
  tx = optax.sgd(0.1)
  params = variables['params']

  def linen_loss(params):
    return jnp.sum(linen.apply({**variables, 'params': params}, x, **training) * weights)

  with masks_in_call_order():
    grads = jax.grad(linen_loss)(params)
  updates, _ = tx.update(grads, tx.init(params), params)
  stepped = {**variables, 'params': optax.apply_updates(params, updates)}
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  with masks_in_call_order():
    nnx_grads = nnx.grad(lambda m: jnp.sum(m(x) * weights))(model)
  optimizer.update(model, nnx_grads)
  model.eval()
  _equal('outputs after a training step', model(other), linen.apply(stepped, other, **evaluating), configuration)


def _written_module(program: Program, directory) -> object:
  name = f'random_linen_{next(_names)}'
  (directory / f'{name}.py').write_text(program.source())
  if str(directory) not in sys.path:
    sys.path.insert(0, str(directory))
  return importlib.import_module(name)


@pytest.fixture(scope='module')
def directory(tmp_path_factory):
  path = tmp_path_factory.mktemp('random_programs')
  yield path
  if str(path) in sys.path:
    sys.path.remove(str(path))


def _changed(program: Program, traced: dict) -> list[dict]:
  """A pinned example's configurations: every field changed at once, then
  the loop emptied."""
  changed = {'widths': (2, 5, 3), 'config': {'hidden': 6, 'scale': 2.0}, 'norm': True, 'use_bias': False,
             'rate': 0.25, 'kind': 'scaled', 'num_classes': 4}
  configurations = [{**traced, **{f: v for f, v in changed.items() if f in program.fields}, 'in_features': 3}]
  if 'widths' in program.fields:
    configurations.append({**configurations[0], 'widths': ()})
  return configurations


def _pinned(test):
  """CI runs one pinned program alone (written, and checked by this test
  alone); `nightly` the others and the random ones, where it explores."""
  pinned = [EVERY_KIND_OF_FIELD] if PROFILE == 'ci' else [EVERY_KIND_OF_FIELD, GUIDE_MLP, FLAGS_AND_CONFIG]
  for program in reversed(pinned):
    test = example(program=program, data=None)(test)
  return test


@_pinned
@settings(compiling, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                            HealthCheck.data_too_large],
          **({'phases': [Phase.explicit]} if PROFILE == 'ci' else {}))
@given(program=random_programs.programs(), data=st.data())
def test_a_proven_port_is_right_at_configurations_it_never_saw(program, data, directory):
  module = _written_module(program, directory)
  traced = {f: getattr(module.Model, f) for f in program.fields}
  traced = {f: v if f != 'config' else {'hidden': v.hidden, 'scale': v.scale} for f, v in traced.items()}
  in_features = 4
  linen, _ = _linen_module(module, {**traced, 'in_features': in_features})
  kwargs = {'train': False} if program.trains else {}
  out = directory / f'{module.__name__}_nnx.py'
  model = LinenModel(linen, jnp.ones((2, in_features)), **kwargs)
  if data is None and PROFILE == 'ci':
    # CI: the pinned program as written, its proof left out (the checks
    # below are this test's own); nightly, and every random one, proven.
    written, _ = generate.write(model, module_name=out.stem)
    emit.write_text(str(out), written.text)
    emit.write_text(paths_file(str(out)), written.paths_text)
    assert not written.stubs
    generated = import_file(str(out))
    for configuration in _changed(program, traced):
      check_port_at(program, module, generated, configuration)
    return
  result = port(model, str(out))
  # The pinned programs are ones the port writes: the property checks them.
  assert data is not None or result.proven, (result.failure, result.checks)
  if not result.proven:
    why = 'stubbed' if result.stubs else 'not proven'
    event(f'{why}: {(result.failure or (result.stubs and result.stubs[0].reason) or "")[:60]}')
    assert result.failure or result.stubs, result.checks
    return
  event('proven')
  generated = import_file(str(out))
  if data is None:
    configurations = _changed(program, traced)
  else:
    configurations = [data.draw(random_programs.configurations(program)) for _ in range(2)]
  for configuration in configurations:
    check_port_at(program, module, generated, configuration, result.branches)
