"""A Linen training run the written port takes over, through a checkpoint.

`assert_checkpoint_trains_on(linen_model, port_path, directory, factory=...)`:

1. Linen trains `k` steps (a `TrainState` with a field per collection
   besides `params`, as `linen-nnx convert` reads one; Adam) and saves the
   state with Orbax;
2. `linen-nnx convert --to nnx --paths <port module>_paths:PATHS`, run as a user
   runs it (its own process), converts the checkpoint for the port;
3. the port restores it as NNX restores any checkpoint, and the restored
   state is checked equal to Linen's converted in memory; then it trains on
   (`converters.testing.assert_training_equivalent`): the NNX steps after
   the Linen ones equal Linen's own, every leaf;
4. and the two final models compute the same outputs, each in its own
   framework (nothing shared with the mapping).

Steps run in training mode where the model has one, dropout left out on
both sides (its random streams differ by framework). The loss is the mean
of squares of the outputs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn
from flax import nnx
from flax.training.train_state import TrainState

from converters.linen_model import LinenModel, split_arrays
from converters.port import prove
from converters.testing import assert_training_equivalent
from converters.testing.port import (
    linen_draws,
    mean_square_loss,
    nnx_call,
    on_one_replica,
    without_linen_dropout,
    without_nnx_dropout,
)


def make_tx() -> optax.GradientTransformation:
  """The optimizer of the run (`linen-nnx convert --optimizer`)."""
  return optax.adam(1e-3)


def _train_state_class(linen_model: LinenModel, collections: tuple[str, ...]) -> type:
  """The user's `TrainState` class, else `TrainState` with a field per
  collection, as `linen-nnx convert` builds it."""
  if linen_model.train_state is not None or not collections:
    return linen_model.train_state or TrainState
  namespace = {'__annotations__': dict.fromkeys(collections, Any), '__module__': __name__}
  return type('TrainState', (TrainState,), namespace)


def _linen_step(module: nn.Module, kwargs: Mapping, collections: tuple[str, ...], rebuild,
                axis_name: str | None, streams: tuple[str, ...]):
  """`(state, arrays) -> state`: one Linen training step on the inputs
  `rebuild(*arrays)` gives back (a count among them stays a Python value),
  as one replica of `axis_name` where given (see `on_one_replica`)."""
  def step(state, arrays):
    inputs = rebuild(*arrays)[0]

    def loss(params):
      variables = {'params': params, **{c: getattr(state, c) for c in collections}}
      with nn.intercept_methods(without_linen_dropout), linen_draws(streams):
        if not collections:
          return mean_square_loss(module.apply(variables, *inputs, **kwargs)), {}
        outputs, written = module.apply(variables, *inputs, mutable=list(collections), **kwargs)
      return mean_square_loss(outputs), written

    grads, written = jax.grad(loss, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads, **written)

  if axis_name is None:
    return jax.jit(step)
  run = jax.jit(on_one_replica(lambda state, *arrays: step(state, arrays), axis_name))
  return lambda state, arrays: run(state, *arrays)


def _nnx_step(kwargs: Mapping, rebuild, axis_name: str | None, streams: tuple[str, ...]):
  """`(model, optimizer, arrays)`: one NNX training step, in place, as
  `_linen_step`'s."""
  def step(model, optimizer, arrays):
    def loss(model):  # each step draws as Linen's does (see `linen_draws`)
      return mean_square_loss(nnx_call(model, *rebuild(*arrays)[0], drawn_streams=streams, **kwargs))

    optimizer.update(model, nnx.grad(loss)(model))

  if axis_name is None:
    return nnx.jit(step)

  def pure(graphdef, state, arrays):
    model, optimizer = nnx.merge(graphdef, state)
    step(model, optimizer, arrays)
    return nnx.state((model, optimizer))

  compiled: list = []  # (graphdef, its step): a graphdef may hold lists, which jit cannot hash

  def replica_step(model, optimizer, arrays):
    graphdef, state = nnx.split((model, optimizer))
    if not compiled or compiled[0][0] != graphdef:
      run = on_one_replica(lambda s, *xs: pure(graphdef, s, xs), axis_name)
      compiled[:] = [(graphdef, jax.jit(run))]
    nnx.update((model, optimizer), compiled[0][1](state, *arrays))

  return replica_step


def _models_module(directory: str, factory: str, port_path: str, cls: str, rules) -> str:
  """A module the command imports the models from: the Linen factory as
  given, the port built at its configuration, the logical rules."""
  module, _, function = factory.partition(':')
  path = os.path.join(directory, '_port_models.py')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(textwrap.dedent(f'''\
        """The models `linen-nnx convert` reads: written by `assert_checkpoint_trains_on`."""
        from converters.port import prove
        from {module} import {function} as linen_model

        RULES = {tuple(rules)!r}
        # Called here, outside the traces the command builds models in.
        _CONFIGURED = linen_model()


        def nnx_model():
          return prove.build(getattr(prove.import_file({port_path!r}), {cls!r}), _CONFIGURED)
        '''))
  return '_port_models'


def convert(source: str, destination: str, *, factory: str, port_path: str, cls: str, variables,
            directory: str) -> None:
  """`linen-nnx convert SRC DST --to nnx` for the port at `port_path`, in a
  process of its own, on the caller's mesh and rules if it has some, else
  on a mesh with the axes the variables' annotations name (each logical
  name its own, as the proof resolves them), each of size one, and one
  over every device the process sees, which no annotation names."""
  axes, logical = prove.annotation_axes(variables)
  context_rules = tuple(tuple(rule) for rule in nn.get_logical_axis_rules())
  rules = context_rules or tuple((name, name) for name in sorted(logical))
  models = _models_module(directory, factory, port_path, cls, rules)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    # Every device the process sees (the command wants them all), on an
    # axis no annotation names: the arrays whole on each.
    devices = len(jax.devices())
    sizes, names = [devices] + [1] * len(axes), ['devices_', *axes]
  else:  # the caller's mesh (a factory may set it for its constraints)
    sizes, names = list(mesh.axis_sizes), list(mesh.axis_names)
    devices = math.prod(sizes)
  port_module = os.path.splitext(os.path.basename(port_path))[0]
  command = [
      sys.executable, '-m', 'linen_nnx_cli.main', 'convert', source, destination, '--to', 'nnx',
      '--linen-model', factory, '--nnx-model', f'{models}:nnx_model',
      '--paths', f'{port_module}_paths:PATHS', '--optimizer', f'{__name__}:make_tx',
      '--devices', str(devices), '--mesh', 'x'.join(map(str, sizes)), '--mesh-axes', ','.join(names),
  ] + (['--rules', f'{models}:RULES'] if rules else [])
  path = os.pathsep.join([directory, os.path.dirname(os.path.abspath(port_path)), *sys.path])
  result = subprocess.run(command, env={**os.environ, 'PYTHONPATH': path}, capture_output=True, text=True,
                          check=False)
  if result.returncode != 0:
    # The command says why on the last line of stderr (progress lines above it).
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines() or ['(nothing printed)']
    raise AssertionError(f'linen-nnx convert failed (exit {result.returncode}): {lines[-1]}')


@dataclasses.dataclass(frozen=True)
class _Mode:
  """The Linen model in the mode the run trains in and in the one it
  evaluates in, and the call's arguments in each: the mode from the call's
  flags (`train_kwargs`, None where it has none) or from the model's own
  fields (a Linen module per mode); `nnx_kwargs` are the port's, without
  the flags."""

  trains: bool
  train_module: nn.Module
  eval_module: nn.Module
  inputs: tuple
  eval_kwargs: dict
  train_kwargs: dict | None
  nnx_kwargs: dict


def _mode(linen_model: LinenModel, modes: Mapping[str, bool]) -> _Mode:
  """The run's modes of `linen_model`, the port's being `modes`."""
  fields = prove.mode_fields(linen_model, modes)
  inputs, eval_kwargs, nnx_kwargs, train_kwargs = prove.call_keywords(linen_model, modes)
  module = linen_model.module
  train_module = prove.with_values(module, fields) if fields else module
  eval_module = prove.with_values(module, {f: not t for f, t in fields.items()}) if fields else module
  return _Mode(train_kwargs is not None or bool(fields), train_module, eval_module, inputs, eval_kwargs,
               train_kwargs, nnx_kwargs)


@dataclasses.dataclass(frozen=True)
class _LinenRun:
  """Linen's side of the run: its variables as initialised (on the mesh
  of the annotations, where they have some), its step, the batches (those
  before the checkpoint, then those after), the state they start from and
  the one saved after the first `k`."""

  variables: dict
  collections: tuple[str, ...]
  rebuild: Callable
  arrays: tuple
  axis_name: str | None
  step: Callable
  batches: list[tuple]
  start: TrainState
  trained: TrainState


def _train_linen(linen_model: LinenModel, mode: _Mode, streams: tuple[str, ...], checkpoint: str, *, k: int,
                 steps: int) -> _LinenRun:
  """Linen trains `k` steps from its initial variables (`k + steps` batches
  made) and saves the state with Orbax to `checkpoint`."""
  variables = prove.linen_variables(LinenModel(mode.eval_module, *linen_model.args, **linen_model.kwargs),
                                    mode.inputs, mode.eval_kwargs, streams)
  collections = tuple(sorted(c for c in variables if c != 'params'))
  state_class = _train_state_class(linen_model, collections)
  context, mesh = prove.annotation_context(variables)
  inputs = mode.inputs
  with context:
    if mesh is not None:
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      variables, inputs = jax.tree.map(lambda x: jax.device_put(x, replicated), (variables, inputs))
    state = state_class.create(
        apply_fn=linen_model.module.apply, params=variables['params'], tx=make_tx(),
        **{c: variables[c] for c in collections},
    )
    axis_name = prove.batch_axis_name(linen_model)
    rebuild, arrays = split_arrays(inputs, {})
    linen_step = _linen_step(mode.train_module, mode.train_kwargs or mode.eval_kwargs, collections, rebuild,
                             axis_name, streams)
    batches = [tuple(arrays)] * (k + steps)
    trained = state
    for batch in batches[:k]:
      trained = linen_step(trained, batch)
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(os.path.abspath(checkpoint), trained)
  return _LinenRun(variables, collections, rebuild, tuple(arrays), axis_name, linen_step, batches, state, trained)


def _restored_port(nnx_class: type, linen_model: LinenModel, checkpoint: str) -> tuple[nnx.Module, nnx.Optimizer]:
  """The port and its optimizer, restored from the converted `checkpoint`
  as NNX restores any checkpoint."""
  model = prove.build(nnx_class, linen_model)
  optimizer = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)
  target = nnx.state({'model': model, 'optimizer': optimizer})
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(os.path.abspath(checkpoint), target)
  nnx.update({'model': model, 'optimizer': optimizer}, restored)
  return model, optimizer


def assert_checkpoint_trains_on(
    linen_model: LinenModel, port_path: str, directory: str, *, factory: str,
    modes: Mapping[str, bool] | None = None, k: int = 2, steps: int = 2,
) -> None:
  """See the module docstring. `factory` is `linen_model`'s
  (`pkg.module:function`, as `linen-nnx port` took it); `directory` holds
  the checkpoints (empty, written here)."""
  generated = prove.import_file(port_path)
  cls = type(linen_model.module).__name__
  # Dropout is left out of training on both sides.
  mode = _mode(linen_model, dict(modes or {}))
  streams = prove.drawn_streams(linen_model)
  linen_dir, nnx_dir = os.path.join(directory, 'linen'), os.path.join(directory, 'nnx')
  linen = _train_linen(linen_model, mode, streams, linen_dir, k=k, steps=steps)
  convert(linen_dir, nnx_dir, factory=factory, port_path=port_path, cls=cls, variables=linen.variables,
          directory=directory)
  context, _ = prove.annotation_context(linen.variables)  # the same mesh and rules, entered again
  with context:
    model, optimizer = _restored_port(getattr(generated, cls), linen_model, nnx_dir)
    # Compared bit for bit: NNX's fused attention (no dropout) rounds
    # otherwise than Linen's, which the port's proof measures; here the
    # same attention function on both sides.
    prove.with_linen_attention(model)
    atol = prove.training_atol(model)
    if mode.trains:
      model.train()
      without_nnx_dropout(model)
    else:
      model.eval()
    # The restored port is the conversion's target too (converting never
    # changes it), then the start it trains on from.
    nnx_step = _nnx_step(mode.nnx_kwargs, linen.rebuild, linen.axis_name, streams)
    assert_training_equivalent(
        linen.start, linen.step, (model, optimizer), nnx_step,
        linen.batches, k=k, paths=prove.port_paths(generated), start=(model, optimizer), atol=atol,
    )
    _assert_same_outputs(linen, mode, streams, model, k=k, atol=atol)


def _assert_same_outputs(linen: _LinenRun, mode: _Mode, streams: tuple[str, ...], model: nnx.Module, *,
                         k: int, atol: float) -> None:
  """The final models, each in its own framework, on the inputs (what the
  write of the state through PATHS cannot share): Linen's trained on after
  the checkpoint's `k` steps, and the port `model`, trained on so."""
  final = linen.trained
  for batch in linen.batches[k:]:
    final = linen.step(final, batch)
  collections, rebuild = linen.collections, linen.rebuild

  # `mutable`: a call may write a collection in eval mode too (a counter).
  def apply(variables, *xs):
    with linen_draws(streams):
      if collections:
        return mode.eval_module.apply(variables, *rebuild(*xs)[0], mutable=list(collections),
                                      **mode.eval_kwargs)[0]
      return mode.eval_module.apply(variables, *rebuild(*xs)[0], **mode.eval_kwargs)

  model.eval()
  graphdef, state = nnx.split(model)

  def call(state, *xs):
    return nnx_call(nnx.merge(graphdef, state), *rebuild(*xs)[0], drawn_streams=streams, **mode.nnx_kwargs)

  axis_name = linen.axis_name
  mapped = (lambda f: f) if axis_name is None else (lambda f: on_one_replica(f, axis_name))
  final_variables = {'params': final.params, **{c: getattr(final, c) for c in collections}}
  linen_out = jax.jit(mapped(apply))(final_variables, *linen.arrays)
  nnx_out = jax.jit(mapped(call))(state, *linen.arrays)
  for a, b in zip(jax.tree.leaves(linen_out), jax.tree.leaves(nnx_out), strict=True):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=atol,
                               err_msg='outputs after training on from the converted checkpoint')
