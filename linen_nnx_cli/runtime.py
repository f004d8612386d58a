"""What a command needs before it runs, and the multi-process job it may join.

`Needs` is what `linen-nnx` prepares for a command (set as its parser's
default): nothing (`side-by-side` reads source files), simulated devices
(`port`), or the whole runtime of the other commands (devices, the
allocator, quiet library logs, a joined multi-process job).
"""

from __future__ import annotations

import argparse
import enum
import os
import sys


class Needs(enum.Enum):
  """What the command line prepares before running a command."""

  NOTHING = 'nothing'
  DEVICES = 'devices'
  JOB = 'job'


def joins_a_job(args: argparse.Namespace) -> bool:
  """Whether the command line asks to join a multi-process job."""
  return bool(getattr(args, 'distributed', False) or getattr(args, 'coordinator', None))


def join(args: argparse.Namespace) -> None:
  """`jax.distributed.initialize` when asked; gloo collectives for CPU devices."""
  if not joins_a_job(args):
    return
  import jax

  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(
      args.coordinator, args.num_processes, args.process_id, initialization_timeout=120
  )


def keep_stdout_for_json() -> None:
  """Sends what native libraries print to stdout (gloo does, in a
  multi-process job) to stderr.

  Python's `sys.stdout` keeps the real stdout, so `--json` output stays
  machine-readable.
  """
  sys.stdout.flush()
  real_stdout = os.dup(1)
  os.dup2(2, 1)
  sys.stdout = os.fdopen(real_stdout, 'w', buffering=1)


def first_process() -> bool:
  """Whether this is the job's first process (the one that reports)."""
  import jax

  return jax.process_index() == 0
