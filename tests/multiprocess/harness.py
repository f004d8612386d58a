"""Runs one scenario in several JAX processes on localhost, as one multi-controller job.

Each process is a fresh interpreter running `tests/multiprocess/worker.py`: CPU
only, `devices` simulated devices each, gloo collectives, and
`jax.distributed.initialize` on a free local port. Together they form one set of
`processes * devices` global devices, so a 2x4 mesh spans both processes and
its arrays are not fully addressable in either. Every run has a deadline: on
timeout all processes are killed, and any failure shows every process's output.

On a real cluster the same worker body runs once per host, with
`jax.distributed.initialize()` reading the coordinator from the environment
(see docs/guides/multiple_hosts.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

from tests import warm_python

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'worker.py')
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class ProcessRun:
  process: int
  returncode: int | None
  output: str
  result: dict | None


def process_env() -> dict[str, str]:
  """The environment of a JAX process the tests start: CPU only, the kit on the
  path, and this process's compiler options (`XLA_FLAGS`; each process sets
  its own device count with `simulate_cpu_devices`, which replaces ours)."""
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def describe(runs: list[ProcessRun]) -> str:
  return '\n'.join(
      f'--- process {r.process}: exit {r.returncode}, result {r.result}\n{r.output[-6000:]}'
      for r in runs
  )


def run_processes(
    scenario: str,
    workdir,
    options: dict | None = None,
    processes: int = 2,
    devices: int = 4,
    timeout_s: float = 300.0,
) -> list[ProcessRun]:
  """Runs `scenario` in `processes` processes; returns each one's exit and result.

  `options[i]` (a dict keyed by process index, optional) is passed to process
  i only, so a test can make processes disagree.
  """
  port = free_port()
  options = options or {}
  env = process_env()
  launched = []
  for p in range(processes):
    log = open(os.path.join(workdir, f'process_{p}.log'), 'w+')
    result = os.path.join(workdir, f'process_{p}.json')
    command = [
        sys.executable, WORKER, scenario, str(p), str(processes), str(devices),
        str(port), str(workdir), json.dumps(options.get(p, {})), result,
    ]
    proc = subprocess.Popen(
        warm_python.command(command, env), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    launched.append((proc, log, result))
  deadline = time.monotonic() + timeout_s
  timed_out = False
  for proc, _, _ in launched:
    try:
      proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      timed_out = True
      break
  if timed_out:
    for proc, _, _ in launched:
      proc.kill()
      proc.wait()
  runs = []
  for p, (proc, log, result) in enumerate(launched):
    log.seek(0)
    output = log.read()
    log.close()
    data = None
    if os.path.exists(result):
      with open(result) as f:
        data = json.load(f)
    runs.append(ProcessRun(p, None if timed_out else proc.returncode, output, data))
  if timed_out:
    raise AssertionError(f'{scenario}: timed out after {timeout_s:.0f} s\n{describe(runs)}')
  return runs


def run_ok(scenario: str, workdir, **kwargs) -> list[dict]:
  """`run_processes`, asserting every process succeeded; their results."""
  runs = run_processes(scenario, workdir, **kwargs)
  if any(r.returncode != 0 or r.result is None for r in runs):
    raise AssertionError(f'{scenario}: a process failed\n{describe(runs)}')
  return [r.result for r in runs]
