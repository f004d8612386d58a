"""How a command fails: one line on stderr saying why, JSON on stdout with
`--json`, the exit code (1: a difference found; 2: bad usage or bad input),
the other processes of a job told."""

from __future__ import annotations

import argparse
import json
import os
import sys


def unwritable_file(path: str) -> str | None:
  """Why a file cannot be written at `path`, or None."""
  if os.path.isdir(path):
    return 'is a directory; give a file name such as losses.png'
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    return f'the directory {parent} does not exist; create it or choose another path'
  if not os.access(parent, os.W_OK | os.X_OK):
    return f'the directory {parent} is not writable'
  return None


def usage_failure(argv: list[str], message: str, commands: tuple[str, ...]) -> int:
  """A usage error: one line on stderr, JSON on stdout with --json; exit 2
  (`commands`: the names a command line may hold)."""
  command = next((a for a in argv if a in commands), None)
  args = argparse.Namespace(command=command or '', json='--json' in argv)
  if command and argv[0].startswith('-') and argv[0] not in ('-h', '--help'):
    # argparse took the option's value for the command: say what went wrong.
    message = f'{argv[0]} comes before the command; options go after it: linen-nnx {command} ... {argv[0]} ...'
  hint = f'linen-nnx {command} --help' if command else 'linen-nnx --help'
  return fail(args, f'{message} (see {hint})', 2)


def fail(args: argparse.Namespace, reason: str, code: int) -> int:
  """One line on stderr (and a JSON object with --json); returns `code`.

  In a multi-process job the other processes are told, so they stop waiting.
  """
  line = ' '.join(reason.split())
  if 'jax' in sys.modules:
    import jax

    if jax.process_count() > 1:
      from converters.distributed import report_failure

      report_failure(line)
      line = f'process {jax.process_index()}: {line}'

  prefix = f'linen-nnx {args.command}' if args.command else 'linen-nnx'
  print(f'{prefix}: {line}', file=sys.stderr)
  if getattr(args, 'json', False):
    print(json.dumps({'ok': False, 'exit_code': code, 'error': line}))
  return code
