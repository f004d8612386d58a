"""The `linen-nnx` command line.

    linen-nnx demo [--devices 8] [--layers 4] [--depth 1024] [--scan] ...
    linen-nnx convert SRC DST --to nnx|linen [--layout scan|loop] [--mesh 2x4]
                      [--linen-model pkg.mod:factory --nnx-model pkg.mod:factory
                       --paths pkg.mod:MAPPING --optimizer pkg.mod:make_tx]
                      [--force] [--json]
    linen-nnx compare [A B] [--mesh 2x4] [model options] [--json]   (two checkpoints)
    linen-nnx compare [--layers 4 ...] [--steps 3]  (a model description)
    linen-nnx map --linen-model pkg.mod:factory --nnx-model pkg.mod:factory [--json]
    linen-nnx side-by-side [--markdown PATH] [--html PATH]
    linen-nnx port pkg.mod:factory --out models_nnx.py [--side-by-side port.html]

One module per command (`demo_command`, `convert_command`, ...), each adding
its parser with what it runs (`run`), what it checks before anything starts
(`check`) and what it needs prepared (`runtime.Needs`); `main` prepares that
and runs it. Options that describe the kit's MLP map one to one onto
`ModelDescription`; `--linen-model` and `--nnx-model` name a user's models
instead (`linen_nnx_cli.user_models`). The simulated CPU device count is set
before JAX is imported, so this module imports nothing from JAX at load time.

Exit codes: 0 success; 1 a verification or comparison found a difference; 2 bad
usage or bad input. Every failure prints one line saying why on stderr (and,
with --json, a JSON object with "error" on stdout).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Sequence

from linen_nnx_cli import (
  compare_command,
  convert_command,
  demo_command,
  map_command,
  port_command,
  side_by_side_command,
)
from linen_nnx_cli.devices import simulate_cpu_devices
from linen_nnx_cli.failures import fail, usage_failure
from linen_nnx_cli.options import Parser, UsageError
from linen_nnx_cli.runtime import Needs, join, joins_a_job, keep_stdout_for_json

#: The commands, in the order `linen-nnx --help` lists them.
_COMMAND_MODULES = (demo_command, convert_command, compare_command, map_command, side_by_side_command, port_command)


def build_parser() -> argparse.ArgumentParser:
  """The parser of every command; each sets `run`, `needs` (and `check`) as defaults."""
  parser = Parser(
      prog='linen-nnx',
      description='Port a sharded Flax Linen model to NNX and prove nothing changed.',
  )
  commands = parser.add_subparsers(dest='command', required=True)
  for module in _COMMAND_MODULES:
    module.add_parser(commands)
  return parser


COMMANDS = tuple(module.NAME for module in _COMMAND_MODULES)


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
  """Runs one command; its exit code.

  `own_process`: the process is the command's alone (the installed
  executable), so glibc is set to recycle large buffers
  (`converters.allocator.recycle_large_buffers`); never when the command runs
  inside another program, whose allocator is its own.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    args = build_parser().parse_args(argv)
  except UsageError as e:
    return usage_failure(argv, str(e), COMMANDS)
  if args.needs is not Needs.NOTHING and os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
    try:
      simulate_cpu_devices(args.devices)
    except (ValueError, RuntimeError) as e:
      return fail(args, f'--devices {args.devices}: {e}', 2)
  problem = args.check(args) if hasattr(args, 'check') else None  # before anything starts
  if problem:
    return fail(args, problem, 2)
  if args.needs is Needs.NOTHING or args.needs is Needs.DEVICES:
    return args.run(args)
  if own_process:
    from converters.allocator import recycle_large_buffers

    recycle_large_buffers()
  return _run_in_a_job(args)


def _run_in_a_job(args: argparse.Namespace) -> int:
  """The command, its library logs quiet and the job joined where asked;
  its refusals reported (`VerificationError`: 1, bad input: 2)."""
  from converters.errors import ConversionError, VerificationError
  from kit_mlp.description import InvalidDescriptionError

  if getattr(args, 'json', False) and joins_a_job(args):
    keep_stdout_for_json()
  # Orbax logs a failed background write (a full disk) with tracebacks from
  # each of its threads and tasks; the command reports the failure itself, in
  # one line.
  for logger in ('absl', 'asyncio'):
    logging.getLogger(logger).setLevel(logging.CRITICAL)
  warnings.filterwarnings('ignore', "coroutine '.*' was never awaited", RuntimeWarning)
  try:
    join(args)
  except Exception as e:  # noqa: BLE001 - jax.distributed raises several types
    return fail(args, f'cannot join the multi-process job: {e}', 2)
  try:
    return args.run(args)
  except VerificationError as e:
    return fail(args, str(e), 1)
  except (ConversionError, InvalidDescriptionError) as e:
    return fail(args, str(e), 2)


def entry_point() -> int:
  """The installed `linen-nnx` executable."""
  return main(own_process=True)


if __name__ == '__main__':
  sys.exit(entry_point())
