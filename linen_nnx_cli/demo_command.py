"""`linen-nnx demo`: the kit's MLP in Linen and in NNX side by side on one mesh
(`linen_nnx_cli.demo`), trained alike, their loss curves plotted."""

from __future__ import annotations

import argparse

from linen_nnx_cli.failures import fail, unwritable_file
from linen_nnx_cli.options import (
  OPTIMIZER_CHOICES,
  at_least,
  description_from_args,
  description_options,
)
from linen_nnx_cli.runtime import Needs

NAME = 'demo'

def add_parser(commands) -> argparse.ArgumentParser:
  demo = commands.add_parser(
      NAME,
      parents=[description_options()],
      help='both implementations side by side on one mesh',
  )
  demo.add_argument('--steps', type=at_least(0), default=10, help='training steps')
  demo.add_argument(
      '--plot', metavar='PATH', default='linen-nnx-demo.png',
      help='PNG of both loss curves (needs the plot extra: matplotlib)',
  )
  demo.add_argument('--optimizer', default='adam', choices=OPTIMIZER_CHOICES)
  demo.set_defaults(run=run, check=check, needs=Needs.JOB)
  return demo


def check(args: argparse.Namespace) -> str | None:
  """Why the command line cannot run, found before anything starts; else None."""
  if args.plot:
    problem = unwritable_file(args.plot)
    if problem:
      return f'--plot {args.plot}: {problem}'
  return None


def run(args: argparse.Namespace) -> int:
  from kit_mlp.description import InvalidDescriptionError
  from linen_nnx_cli.demo import run_demo

  try:
    desc = description_from_args(args)
  except InvalidDescriptionError as e:
    return fail(args, f'invalid model description: {e}', 2)
  try:
    return run_demo(desc, steps=args.steps, optimizer=args.optimizer, plot=args.plot)
  except OSError as e:  # the plot could not be written after all
    return fail(args, f'--plot {args.plot}: {e.strerror or e}', 2)
