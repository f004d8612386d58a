"""`linen-nnx compare`, in one of two modes, by its arguments:

- two checkpoints `A B`: every parameter and optimizer-state leaf compared
  (`converters.checkpoint.compare`), or with `--outputs` the outputs of the
  models each restores into;
- none: the kit's MLP described by the options, built in both frameworks from
  identical parameters, trained `--steps` steps each and compared
  (`linen_nnx_cli.compare_training`).

Exit 0 when identical, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import sys

from linen_nnx_cli.failures import fail
from linen_nnx_cli.options import (
  OPTIMIZER_CHOICES,
  at_least,
  description_from_args,
  description_options,
  distributed_options,
  model_options,
)
from linen_nnx_cli.runtime import Needs, first_process
from linen_nnx_cli.user_models import models_options

NAME = 'compare'

def add_parser(commands) -> argparse.ArgumentParser:
  compare = commands.add_parser(
      NAME,
      parents=[description_options()],
      help='compare Linen and NNX leaf by leaf: two checkpoints, or a description',
      description=(
          'With two checkpoints A and B: read both and compare every parameter '
          'and optimizer-state leaf. Without: build both implementations of the '
          'described model from identical parameters, train --steps steps on '
          'each and compare. Exit 0 when identical, 1 when not.'
      ),
  )
  distributed_options(compare)
  compare.add_argument(
      'checkpoints', nargs='*', metavar='A B',
      help='two checkpoints to compare; none: compare the two implementations of a description')
  compare.add_argument(
      '--allow-unfinished', action='store_true',
      help='read Orbax saves that never finished (their arrays may be incomplete)',
  )
  compare.add_argument(
      '--steps', type=at_least(0), default=3, help='training steps (description)'
  )
  compare.add_argument(
      '--optimizer', default=None, metavar='NAME|pkg.module:make_tx',
      help=f'a description\'s optimizer ({", ".join(OPTIMIZER_CHOICES)}; default adam), '
      "or your models' optax transform",
  )
  model_options(compare)
  compare.add_argument(
      '--outputs', action='store_true',
      help='with two checkpoints and your models: restore each into its own '
      "framework's model and compare their outputs on the Linen model's example "
      'inputs, on them made generic and with selectors drawn anew, their gradients, '
      'and their outputs in training: a check independent of any path mapping',
  )
  compare.add_argument('--json', action='store_true', help='print a JSON report on stdout')
  compare.set_defaults(run=run, check=check, needs=Needs.JOB)
  return compare


def check(args: argparse.Namespace) -> str | None:
  """Why the command line is neither mode, found before anything starts; else None."""
  if len(args.checkpoints) not in (0, 2):
    return 'compare takes two checkpoints A B, or none (a description)'
  if args.outputs and not args.checkpoints:
    return '--outputs compares the models two checkpoints restore into: give A B'
  return None


def run(args: argparse.Namespace) -> int:
  """The mode the arguments name: two checkpoints, or a description."""
  return _compare_checkpoints(args) if args.checkpoints else _compare_description(args)


def _compare_checkpoints(args: argparse.Namespace) -> int:
  from converters.checkpoint.compare import compare_checkpoints, compare_outputs
  from linen_nnx_cli.kit_models import models_for

  options = models_options(args)
  if args.outputs and 'linen_model' not in options:
    return fail(args, '--outputs runs your two models: give --linen-model and --nnx-model', 2)
  compare = compare_outputs if args.outputs else compare_checkpoints
  rows, labels, extra = compare(
      *args.checkpoints, models=models_for(**options), allow_unfinished=args.allow_unfinished
  )
  return _report_comparison(args, rows, labels, extra)


def _compare_description(args: argparse.Namespace) -> int:
  from kit_mlp.description import InvalidDescriptionError
  from linen_nnx_cli.compare_training import compare_description

  try:
    desc = description_from_args(args)
  except InvalidDescriptionError as e:
    return fail(args, f'invalid model description: {e}', 2)
  optimizer = args.optimizer or 'adam'
  if optimizer not in OPTIMIZER_CHOICES:
    return fail(args, f'--optimizer {optimizer}: choose one of {", ".join(OPTIMIZER_CHOICES)}', 2)
  rows, extra = compare_description(desc, optimizer, args.steps)
  return _report_comparison(args, rows, ('Linen', 'NNX'), extra)


def _report_comparison(args, rows, labels, extra: dict) -> int:
  """Prints the table (or JSON) of `rows`; 0 when every row is identical, else 1."""
  from converters.checkpoint import compare
  from linen_nnx_cli import tables

  differing = sum(not r.identical for r in rows)
  identical = differing == 0
  if not first_process():
    return 0 if identical else 1
  if args.json:
    print(json.dumps({'ok': identical, 'identical': identical, **extra,
                      'leaves': compare.as_json(rows)}, indent=2))
  else:
    tables.print_table(*tables.comparison_rows(rows, labels))
    noun = ('output' if len(rows) == 1 else 'outputs') if extra.get('outputs') else (
        'leaf' if len(rows) == 1 else 'leaves')
    print(f'\n{len(rows)} {noun}: ' + ('all identical' if identical else f'{differing} differ'))
    for key, what in (
        ('rng_not_compared', ('NNX RNG leaves (dropout keys and counts), which the other '
                              'checkpoint holds in another form or not at all (Linen has none)')),
        ('nnx_only_not_compared', ('leaves of state only the NNX port has (a one-sided rule '
                                   'names them), which one checkpoint holds and the other does not')),
    ):
      if skipped := extra.get(key):
        print(f'not compared: {len(skipped)} {what}: ' + ', '.join(skipped))
  if not identical:
    print(f'linen-nnx compare: {differing} leaves differ', file=sys.stderr)
  return 0 if identical else 1
