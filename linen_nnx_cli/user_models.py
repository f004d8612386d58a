"""Loading the user's models, path mapping, rules and optimizer named on the command line.

`--linen-model pkg.module:factory` names an object as `pkg.module:attribute`
(dots after the colon reach into it: `pkg.module:Models.linen`). The current
directory comes first on the import path, as it does for `python -m`, so a
module beside the user's checkpoints is found. Anything that goes wrong while
importing or finding the object is reported as a `UserObjectError` naming the
option, the spec and the cause; the user's own exception is chained.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from converters.errors import CheckpointError, ConversionError


class UserObjectError(CheckpointError):
  """An object named on the command line cannot be imported or found."""


def load(option: str, spec: str) -> Any:
  """The object `spec` (`pkg.module:attribute`) names, for `option`'s message."""
  module_name, colon, attribute = spec.partition(':')
  if not colon or not module_name or not attribute:
    raise UserObjectError(
        f'{option} {spec}: name an object as pkg.module:attribute, e.g. '
        f'{option} my_models:make_linen'
    )
  cwd = os.getcwd()
  if cwd not in sys.path:
    sys.path.insert(0, cwd)
  try:
    obj = importlib.import_module(module_name)
  except Exception as e:  # the user's module: any error of theirs
    raise UserObjectError(
        f'{option} {spec}: importing {module_name} failed: {type(e).__name__}: {e}'
    ) from e
  for part in attribute.split('.'):
    try:
      obj = getattr(obj, part)
    except AttributeError as e:
      raise UserObjectError(
          f'{option} {spec}: {module_name} has no {attribute!r} ({part!r} is missing)'
      ) from e
  return obj


def models_options(args) -> dict:
  """The keyword arguments of `linen_nnx_cli.kit_models.models_for` that
  describe the models: the user's (`--linen-model` ...) or the kit's MLP."""
  from kit_mlp.description import RULE_SETS

  user = args.linen_model is not None or args.nnx_model is not None
  options: dict[str, Any] = {'mesh_shape': args.mesh}
  if user:
    options['linen_model'] = load('--linen-model', args.linen_model) if args.linen_model else None
    options['nnx_model'] = load('--nnx-model', args.nnx_model) if args.nnx_model else None
    if args.mesh_axes is not None:
      options['mesh_axes'] = args.mesh_axes
  elif args.mesh_axes is not None:
    options['mesh_axes'] = args.mesh_axes  # refused for the kit's MLP, with the reason
  if args.paths:
    options['paths'] = _paths(args.paths)
  if getattr(args, 'collections', None) is not None:
    options['collections'] = load('--collections', args.collections)
  if args.rules is not None:
    if ':' in args.rules:
      options['rules'] = load('--rules', args.rules)
    elif user:
      raise UserObjectError(
          f'--rules {args.rules}: with your models, name your rules as '
          'pkg.module:RULES (guide and fsdp are the kit MLP\'s rule sets)'
      )
    elif args.rules not in RULE_SETS:
      raise UserObjectError(
          f'--rules {args.rules}: choose one of {sorted(RULE_SETS)}, or '
          'pkg.module:RULES with --linen-model and --nnx-model'
      )
    else:
      options['rules'] = RULE_SETS[args.rules]
  optimizer = getattr(args, 'optimizer', None)
  if optimizer is not None:
    options['optimizer'] = load('--optimizer', optimizer) if ':' in optimizer else optimizer
  if not user:
    options['annotation'] = args.annotation
    options['layer_partition'] = args.layer_partition
  elif args.annotation != 'device' or args.layer_partition is not None:
    raise UserObjectError(
        '--annotation and --layer-partition describe the kit\'s MLP; your models '
        'carry their own annotations (give --rules pkg.module:RULES for logical names)'
    )
  return options


def _paths(given: list[str]):
  """`--paths` as given once or twice: a mapping, 'infer', or both (`Infer(known)`)."""
  from converters.paths import Infer

  specs = [spec for spec in given if spec != 'infer']
  if len(specs) > 1 or len(given) > 2 or given.count('infer') > 1:
    raise UserObjectError(
        f"--paths given {len(given)} times ({', '.join(given)}): give one mapping "
        '(pkg.module:MAPPING), infer, or one of each (the rules you know, the rest inferred)'
    )
  known = load('--paths', specs[0]) if specs else None
  if 'infer' in given:
    try:
      return Infer(known)
    except ConversionError as e:
      raise UserObjectError(f'--paths {specs[0]}: {e}') from e
  return known
