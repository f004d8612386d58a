"""Conversions and checkpoints on a 2x4 mesh spanning two JAX processes.

Two processes on localhost (4 simulated CPU devices each, gloo collectives)
form one mesh whose arrays neither process holds whole; see `harness.py`.
Each test compares what the processes report with a single-process run of the
same work in this (8-device) test process. These are the commands
docs/guides/multiple_hosts.md shows, each host one of these processes.
"""

from __future__ import annotations

import os

import jax
import pytest

from kit_mlp.data import make_batches
from kit_mlp.optimizers import make_tx
from linen_impl import train as linen_train
from tests.multiprocess.harness import describe, run_ok, run_processes
from tests.multiprocess.worker import description


def single_process_losses(steps: int = 3) -> list[float]:
  desc = description()
  mesh = desc.make_mesh()
  trainer = linen_train.make_trainer(desc, mesh, make_tx('adam'))
  losses = []
  with jax.set_mesh(mesh):
    xs, ys = make_batches(desc, mesh, steps, seed=1)
    state = trainer.create(seed=0)
    for i in range(steps):
      state, loss = trainer.train_step(state, xs[i], ys[i])
      losses.append(float(loss))
  return losses[1:]


def test_conversions_and_training_across_processes(tmp_path):
  results = run_ok('conversions', tmp_path)
  expected = single_process_losses()
  for process, r in enumerate(results):
    where = f'process {process}'
    # Neither process holds any array whole, and it touches only its own shards.
    assert not any(r['evidence']['fully_addressable']), where
    assert r['evidence']['foreign_shards'] == 0 and r['evidence']['held_fraction'] == 0.5, where
    assert r['stacked_evidence']['held_fraction'] == 0.5, where
    created = r['nnx_created_evidence']
    assert not any(created['fully_addressable']) and created['foreign_shards'] == 0, where
    assert created['held_fraction'] == 0.5, where
    # Conversions ran with device-to-host transfers disallowed (else the
    # worker fails); the same-layout one copied nothing; the relayouts
    # compiled to purely local programs: no collective at all.
    assert r['zero_copy'], where
    assert r['relayouts_compiled'] >= 2, where
    assert r['collectives_in_relayouts'] == [], where
    assert r['round_trip'], where
    # Linen and the NNX state converted from it train identically, bit for bit.
    assert r['losses']['linen'] == r['losses']['nnx'], where
    # Against a single process the losses agree to float32 rounding, not bit
    # for bit: gloo's all-reduce across processes adds the partial gradients
    # in another order than XLA:CPU's in-process all-reduce (about 1 ulp).
    assert r['losses']['nnx'] == pytest.approx(expected, rel=1e-6, abs=0), where


# Nightly; CI: test_cli_convert_runs_as_one_job_of_two_processes (a verified scan
# conversion across processes, each process's store, the leaves, no staging left).
@pytest.mark.nightly
def test_checkpoint_conversion_across_processes(tmp_path):
  results = run_ok('checkpoint', tmp_path)
  for process, r in enumerate(results):
    where = f'process {process}'
    assert r['identical'], where
    assert r['summary']['verified'] and r['summary']['destination']['layout'] == 'scan', where
    assert r['restored_evidence']['foreign_shards'] == 0, where
    assert r['restored_evidence']['held_fraction'] == 0.5, where
    # Each process wrote its own shards (Orbax's per-process OCDBT stores).
    assert {'ocdbt.process_0', 'ocdbt.process_1'} <= set(r['dst_entries']), where
  left = [e for e in results[1]['workdir_entries'] if not e.startswith('process_')]
  assert left == ['dst', 'src'], 'a staging directory was left'


# Nightly; CI: test_cli_convert_runs_as_one_job_of_two_processes (a verified scan
# conversion across processes, each process's store) and, on one process,
# checkpoint/test_hostile_models.py (users' models converted by the checkpoint tool).
@pytest.mark.nightly
def test_a_users_model_checkpoint_converts_across_processes(tmp_path):
  results = run_ok('zoo_checkpoint', tmp_path)
  for process, r in enumerate(results):
    where = f'process {process}'
    assert r['summary']['verified'] and r['summary']['destination']['layout'] == 'scan', where
    assert r['identical'] and r['leaves'] > 50, where
    assert not all(r['state_evidence']['fully_addressable']), where  # sharded across processes
    assert {'ocdbt.process_0', 'ocdbt.process_1'} <= set(r['dst_entries']), where


# Nightly: `test_cli_processes_given_different_flags_exit_2_naming_the_difference`
# checks this disagreement and message in CI through the same agreement, and
# `test_processes_holding_different_trees_fail_naming_the_difference` the API's error.
@pytest.mark.nightly
def test_processes_given_different_layouts_fail_naming_the_difference(tmp_path):
  runs = run_processes('checkpoint', tmp_path, options={1: {'layout': 'loop'}}, timeout_s=300)
  for r in runs:
    assert r.returncode == 1 and r.result['error'] == 'ProcessMismatchError', describe(runs)
    assert "process 1 differs from process 0 in layout: 'scan' vs 'loop'" in r.result['message']


# Nightly; CI: test_cli_processes_given_different_flags_exit_2_naming_the_difference (processes that
# disagree, across real processes) and test_distributed.py's
# test_a_leaf_only_one_process_holds_is_named_with_the_process (the message of a tree that differs).
@pytest.mark.nightly
def test_processes_holding_different_trees_fail_naming_the_difference(tmp_path):
  runs = run_processes(
      'tree_mismatch', tmp_path, options={1: {'description': {'num_layers': 4}}}, timeout_s=300
  )
  for r in runs:
    assert r.returncode == 1 and r.result['error'] == 'ProcessMismatchError', describe(runs)
    assert 'process 1 differs from process 0 in leaves/DotReluDot_2/Dense_0/kernel (only in process 1)' in (
        r.result['message']
    )


# Nightly; CI: test_a_coordinator_that_fails_first_lingers_until_the_others_have_reported
# (a reported failure named by the other process, the same message) and
# test_a_process_that_does_not_arrive_in_time_is_named_not_waited_for (the wait).
@pytest.mark.nightly
def test_a_process_that_fails_first_is_named_by_the_others(tmp_path):
  # Process 1 fails before converting (an invalid description) and reports it;
  # process 0 stops waiting for it and names it, instead of hanging.
  runs = run_processes(
      'tree_mismatch', tmp_path, options={1: {'description': {'depth': 63}}}, timeout_s=300
  )
  assert runs[1].returncode == 1 and runs[1].result['error'] == 'InvalidDescriptionError'
  assert runs[0].returncode == 1 and runs[0].result['error'] == 'ProcessMismatchError', describe(runs)
  assert 'process 1 failed: InvalidDescriptionError: depth=63' in runs[0].result['message']


def test_a_coordinator_that_fails_first_lingers_until_the_others_have_reported(tmp_path):
  # Process 0, which hosts JAX's coordination service, fails before converting;
  # process 1 reaches the conversion only after that failure is reported, and
  # still prints its own line naming it (JAX's shutdown barrier keeps process
  # 0 up). A coordinator killed outright aborts the others inside XLA: see
  # issue 41, item 5.
  runs = run_processes(
      'tree_mismatch', tmp_path,
      options={0: {'description': {'depth': 63}}, 1: {'late': True}}, timeout_s=300,
  )
  assert runs[0].returncode == 1 and runs[0].result['error'] == 'InvalidDescriptionError', describe(runs)
  assert runs[1].returncode == 1 and runs[1].result['error'] == 'ProcessMismatchError', describe(runs)
  assert 'process 0 failed: InvalidDescriptionError: depth=63' in runs[1].result['message']


def test_a_process_that_does_not_arrive_in_time_is_named_not_waited_for(tmp_path):
  # Process 1 is stuck until process 0 has given up on it (2 s agreement timeout).
  runs = run_processes(
      'tree_mismatch', tmp_path,
      options={0: {'timeout_s': 2}, 1: {'late': True, 'timeout_s': 2}}, timeout_s=300,
  )
  assert runs[0].returncode == 1 and runs[0].result['error'] == 'ProcessMismatchError', describe(runs)
  assert 'process 1 did not arrive within 2 s' in runs[0].result['message']
  # Process 1, arriving late, learns that process 0 gave up.
  assert runs[1].returncode == 1 and 'process 0 failed: ProcessMismatchError' in (
      runs[1].result['message']
  ), describe(runs)


def _cli_in_processes(tmp_path, per_process_args, timeout_s=300):
  import subprocess
  import sys

  from tests import warm_python
  from tests.multiprocess.harness import ROOT, free_port, process_env

  port = free_port()
  env = process_env()
  procs = [
      subprocess.Popen(
          warm_python.command([
              sys.executable, '-m', 'linen_nnx_cli.main', *args, '--devices', '4',
              '--coordinator', f'localhost:{port}', '--num-processes', '2', '--process-id', str(p),
          ], env),
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
      )
      for p, args in enumerate(per_process_args)
  ]
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=timeout_s))
  finally:
    for proc in procs:
      proc.kill()
  return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]


def test_cli_convert_runs_as_one_job_of_two_processes(tmp_path):
  from nnx_impl import checkpoint as nnx_checkpoint
  from nnx_impl import train as nnx_train
  from linen_nnx_cli.kit_models import linen_to_nnx_state
  from tests.converters.checkpoint.fixtures import DESC, same_leaves, write_checkpoint

  linen, state = write_checkpoint(tmp_path / 'src', 'linen', DESC, 'adam')
  args = ['convert', str(tmp_path / 'src'), str(tmp_path / 'dst'), '--to', 'nnx', '--layout', 'scan', '--json']
  results = _cli_in_processes(tmp_path, [args, args])
  assert [r[0] for r in results] == [0, 0], results
  assert '"verified": true' in results[0][1] and results[1][1] == ''  # one summary
  assert {'ocdbt.process_0', 'ocdbt.process_1'} <= set(os.listdir(tmp_path / 'dst'))
  assert [p for p in os.listdir(tmp_path) if p.startswith('.dst.')] == [], 'a staging directory was left'
  trainer = nnx_train.make_trainer(DESC.replace(use_scan=True), linen.mesh, 'adam')
  with jax.set_mesh(linen.mesh):
    expected = linen_to_nnx_state(state, trainer, True, None)
    assert same_leaves(expected, nnx_checkpoint.restore(tmp_path / 'dst', trainer))


def test_cli_processes_given_different_flags_exit_2_naming_the_difference(tmp_path):
  from tests.converters.checkpoint.fixtures import DESC, write_checkpoint

  write_checkpoint(tmp_path / 'src', 'linen', DESC, 'adam')
  args = ['convert', str(tmp_path / 'src'), str(tmp_path / 'dst'), '--to', 'nnx']
  results = _cli_in_processes(tmp_path, [args + ['--layout', 'scan'], args + ['--layout', 'loop']])
  for code, _, err in results:
    assert code == 2, results
    assert "process 1 differs from process 0 in layout: 'scan' vs 'loop'" in err
  assert not os.path.exists(tmp_path / 'dst')
