"""One process of a multi-process scenario; `harness.run_processes` starts it.

    worker.py SCENARIO PROCESS PROCESSES DEVICES PORT WORKDIR OPTIONS RESULT

Sets up CPU devices and gloo collectives, joins the job with
`jax.distributed.initialize`, runs the scenario and writes its JSON result
(or the error) to RESULT. Exits with `os._exit`, so a process whose peer died
never waits in JAX's shutdown barrier. Its scenarios make the calls
docs/guides/multiple_hosts.md shows, as each host of a cluster would.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

COLLECTIVES = ('all-gather', 'all-reduce', 'all-to-all', 'collective-permute', 'reduce-scatter')


def _setup(process: int, processes: int, devices: int, port: int):
  from linen_nnx_cli.devices import simulate_cpu_devices

  simulate_cpu_devices(devices)  # keeps the compiler options the test passed
  import jax

  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(
      f'localhost:{port}', num_processes=processes, process_id=process,
      initialization_timeout=60,
  )
  return jax


def description(**changes):
  from kit_mlp.description import FSDP_RULES, ModelDescription

  # FSDP rules shard every weight over both mesh axes, so every array is
  # split across the two processes: neither holds any array whole.
  base = ModelDescription(
      num_layers=2, depth=64, batch=8, annotation='logical', rules=FSDP_RULES
  )
  return base.replace(**changes)


def _leaves(tree):
  import jax
  from flax import nnx

  if isinstance(tree, nnx.State):
    tree = nnx.to_pure_dict(tree)
  return jax.tree.leaves(tree)


def _shard_evidence(tree) -> dict:
  """Which processes' devices this process's shards live on, and how much it holds."""
  import jax

  me = jax.process_index()
  leaves = _leaves(tree)
  return {
      'fully_addressable': [x.is_fully_addressable for x in leaves],
      'foreign_shards': sum(
          s.device.process_index != me for x in leaves for s in x.addressable_shards
      ),
      'held_fraction': max(
          len({str(s.index) for s in x.addressable_shards})
          / len(set(str(i) for i in x.sharding.devices_indices_map(x.shape).values()))
          for x in leaves if x.ndim
      ),
  }


def _record_relayouts(texts: list[str]) -> None:
  """Keeps the compiled HLO of every relayout the converters run."""
  from converters import execution

  original = execution._compiled_relayout

  def recording(recipe, out_shardings):
    fn = original(recipe, out_shardings)

    def call(*args):
      texts.append(fn.lower(*args).compile().as_text())
      return fn(*args)

    return call

  execution._compiled_relayout = recording


def conversions(workdir: str, options: dict) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from tests.converters.checkpoint.fixtures import same_leaves
  from kit_mlp.data import make_batches
  from kit_mlp.optimizers import make_tx
  from linen_nnx_cli.kit_models import linen_to_nnx_state, nnx_to_linen_state
  from linen_impl import train as linen_train
  from nnx_impl import train as nnx_train

  desc = description(**options.get('description', {}))
  mesh = desc.make_mesh()
  linen = linen_train.make_trainer(desc, mesh, make_tx('adam'))
  nnx_loop = nnx_train.make_trainer(desc, mesh, 'adam')
  nnx_scan = nnx_train.make_trainer(desc.replace(use_scan=True), mesh, 'adam')
  hlo: list[str] = []
  _record_relayouts(hlo)
  steps = 3
  with jax.set_mesh(mesh):
    xs, ys = make_batches(desc, mesh, steps, seed=1)
    state = linen.create(seed=0)
    state, _ = linen.train_step(state, xs[0], ys[0])  # non-zero moments
    evidence = _shard_evidence(state)
    nnx_created = _shard_evidence(nnx_loop.create(seed=0))  # NNX sharded creation
    # No array may reach this host: every conversion runs with device-to-host
    # transfers disallowed.
    with jax.transfer_guard_device_to_host('disallow'):
      same = linen_to_nnx_state(state, nnx_loop, None, None)
      stacked = linen_to_nnx_state(state, nnx_scan, True, None)
      back = nnx_to_linen_state(stacked, nnx_scan, linen, False, None)
      same_back = nnx_to_linen_state(same, nnx_loop, linen, None, None)
    pointers = lambda t: [
        s.data.unsafe_buffer_pointer()
        for x in _leaves(t) if x.ndim  # steps and counts change dtype
        for s in x.addressable_shards
    ]
    zero_copy = sorted(pointers(same)) == sorted(pointers(state))
    round_trip = same_leaves(state, back) and same_leaves(state, same_back)
    stacked_evidence = _shard_evidence(stacked)
    # Train both sides on: the NNX state converted from Linen's (a copy, since
    # the conversion shares Linen's buffers and training donates them).
    arrays = jax.tree.map(jnp.copy, nnx.to_pure_dict(same))
    losses = {'linen': [], 'nnx': []}
    for i in range(1, steps):
      state, loss = linen.train_step(state, xs[i], ys[i])
      losses['linen'].append(float(loss))
      arrays, loss = nnx_loop.train_step(arrays, xs[i], ys[i])
      losses['nnx'].append(float(loss))
  return {
      'evidence': evidence,
      'nnx_created_evidence': nnx_created,
      'stacked_evidence': stacked_evidence,
      'zero_copy': zero_copy,
      'round_trip': round_trip,
      'relayouts_compiled': len(hlo),
      'collectives_in_relayouts': sorted({c for text in hlo for c in COLLECTIVES if c in text}),
      'losses': losses,
  }


def checkpoint(workdir: str, options: dict) -> dict:
  import jax

  from converters.checkpoint.convert import convert_checkpoint
  from linen_nnx_cli.kit_models import models_for
  from tests.converters.checkpoint.fixtures import same_leaves
  from kit_mlp.description import FSDP_RULES
  from kit_mlp.data import make_batches
  from kit_mlp.optimizers import make_tx
  from linen_nnx_cli.kit_models import linen_to_nnx_state
  from linen_impl import checkpoint as linen_checkpoint
  from linen_impl import train as linen_train
  from nnx_impl import checkpoint as nnx_checkpoint
  from nnx_impl import train as nnx_train

  desc = description()
  mesh = desc.make_mesh()
  linen = linen_train.make_trainer(desc, mesh, make_tx('adam'))
  nnx_scan = nnx_train.make_trainer(desc.replace(use_scan=True), mesh, 'adam')
  src, dst = os.path.join(workdir, 'src'), os.path.join(workdir, 'dst')
  with jax.set_mesh(mesh):
    xs, ys = make_batches(desc, mesh, 1, seed=1)
    state, _ = linen.train_step(linen.create(seed=0), xs[0], ys[0])
    linen_checkpoint.save(src, state)
  summary = convert_checkpoint(
      src, dst, 'nnx', models=models_for(annotation='logical', rules=FSDP_RULES),
      layout=options.get('layout', 'scan'),
  )
  with jax.set_mesh(mesh):
    restored = nnx_checkpoint.restore(dst, nnx_scan)
    expected = linen_to_nnx_state(state, nnx_scan, True, None)
    identical = same_leaves(expected, restored)
  return {
      'summary': summary,
      'identical': identical,
      'restored_evidence': _shard_evidence(restored),
      'dst_entries': sorted(os.listdir(dst)),
      'workdir_entries': sorted(os.listdir(workdir)),
  }


def tree_mismatch(workdir: str, options: dict) -> dict:
  import jax

  from converters import distributed as processes

  processes.DEFAULT_TIMEOUT_S = options.get('timeout_s', processes.DEFAULT_TIMEOUT_S)

  from converters import KIT_PATHS, linen_to_nnx
  from kit_mlp.optimizers import make_tx
  from linen_impl import train as linen_train

  desc = description(**options.get('description', {}))
  mesh = desc.make_mesh()
  linen = linen_train.make_trainer(desc, mesh, make_tx('adam'))
  with jax.set_mesh(mesh):
    state = linen.create(seed=0)
    if options.get('late'):  # a process stuck until process 0 gave up on it
      # Process 0's failure report is the event (it writes its result only
      # once this process has seen the report, or after report_failure's wait).
      client, deadline = processes._client(), time.monotonic() + 120
      while processes._try_get(client, processes._failed_key(0)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    linen_to_nnx({'params': state.params}, scan=True, paths=KIT_PATHS)
  return {}


def zoo_checkpoint(workdir: str, options: dict) -> dict:
  """A user's model (the zoo transformer) through the checkpoint tool, across processes."""
  import jax
  import orbax.checkpoint as ocp
  from flax import linen as nn

  from converters.checkpoint.compare import compare_checkpoints
  from converters.checkpoint.convert import convert_checkpoint
  from linen_nnx_cli.kit_models import models_for
  from converters.checkpoint.models import UserModels
  from tests.converters.checkpoint import test_models

  pair = test_models.PAIRS['transformer']
  models = test_models.models_of(pair)
  user = UserModels(
      models['linen_model'], models['nnx_model'], models['paths'], models['rules'],
      models['optimizer'],
  )
  mesh = user.make_mesh()
  side = user.side('linen', mesh)
  src, dst = os.path.join(workdir, 'src'), os.path.join(workdir, 'dst')
  tx = models['optimizer']()
  create = lambda: test_models.linen_train_state(pair, tx)
  with jax.set_mesh(mesh), nn.logical_axis_rules(pair['rules']):
    # Created in its shards, as the annotations place it (the checkpoint tool's own view).
    shardings = jax.tree.unflatten(
        jax.tree.structure(jax.eval_shape(create)),
        [a.sharding for a in jax.tree.leaves(side.abstract_state)],
    )
    state = jax.jit(create, out_shardings=shardings)()
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(src, state)
  summary = convert_checkpoint(src, dst, 'nnx', models=models_for(**models), layout='scan')
  rows, _, _ = compare_checkpoints(src, dst, models=models_for(**models))
  return {
      'summary': summary,
      'identical': all(r.identical for r in rows),
      'leaves': len(rows),
      'state_evidence': _shard_evidence(state.params),
      'dst_entries': sorted(os.listdir(dst)),
  }


SCENARIOS = {
    'conversions': conversions, 'checkpoint': checkpoint, 'tree_mismatch': tree_mismatch,
    'zoo_checkpoint': zoo_checkpoint,
}


def main() -> None:
  scenario, process, processes, devices, port, workdir, options, result = sys.argv[1:]
  _setup(int(process), int(processes), int(devices), int(port))
  try:
    out, code = SCENARIOS[scenario](workdir, json.loads(options)), 0
  except Exception as e:  # reported to the test, which decides
    traceback.print_exc()
    out, code = {'error': type(e).__name__, 'message': str(e)}, 1
    from converters.distributed import report_failure

    report_failure(f'{type(e).__name__}: {e}')
  with open(result, 'w') as f:
    json.dump(out, f)
  if int(process) == 0:
    # Process 0 hosts the coordination service: leaving while another process
    # still talks to it aborts that process before it writes its result.
    others = [os.path.join(os.path.dirname(result), f'process_{p}.json') for p in range(1, int(processes))]
    deadline = time.monotonic() + 120
    while not all(os.path.exists(o) for o in others) and time.monotonic() < deadline:
      time.sleep(0.1)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


if __name__ == '__main__':
  main()
