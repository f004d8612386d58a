"""`linen-nnx map`: the path mapping of your Linen model and its NNX port,
inferred from what they compute (`converters.infer_paths`), printed as
Python to keep or as JSON."""

from __future__ import annotations

import argparse
import json

from linen_nnx_cli.failures import fail
from linen_nnx_cli.options import annotation_options, model_options
from linen_nnx_cli.runtime import Needs
from linen_nnx_cli.user_models import models_options

NAME = 'map'

def add_parser(commands) -> argparse.ArgumentParser:
  map_ = commands.add_parser(
      NAME,
      help='print the path mapping of your Linen model and its NNX port, inferred '
      'from what they compute',
      description=(
          'Trace both models abstractly (no parameter is materialised), pair every '
          'variable by where the computation uses it, and print the PathMapping as '
          'Python to keep (or --json). Rules given with --paths take precedence.'
      ),
  )
  annotation_options(map_.add_argument_group('mesh and annotations'))
  model_options(map_)
  map_.add_argument('--layout', choices=('scan', 'loop'), default=None,
                    help='the layout to make both models in (their factories take layout=)')
  map_.add_argument('--name', default='PATHS', help='the variable name of the printed mapping')
  map_.add_argument('--json', action='store_true', help='print the rules as JSON on stdout')
  map_.set_defaults(run=run, needs=Needs.JOB)
  return map_


def run(args: argparse.Namespace) -> int:
  from converters.checkpoint.models import UserModels
  from converters.paths import as_infer
  from linen_nnx_cli.kit_models import models_for

  options = models_options(args)
  if 'linen_model' not in options or 'nnx_model' not in options:
    return fail(args, 'map needs your two models: --linen-model and --nnx-model', 2)
  given = options.pop('paths', None)
  models = models_for(**options)
  assert isinstance(models, UserModels)
  infer = as_infer(given)
  mapping = models.inferred(args.layout, paths=infer.known if infer is not None else given)
  if args.json:
    print(json.dumps({'ok': True, 'rules': [
        {'linen': r.linen, 'nnx': r.nnx} | {
            field: getattr(r, field) for field in ('linen_stacked', 'nnx_stacked')
            if getattr(r, field) is not None
        } | ({'transform': repr(r.transform)} if r.transform is not None else {})
        for r in mapping.rules
    ]}, indent=2))
  else:
    print(mapping.to_python(args.name), end='')
  return 0
