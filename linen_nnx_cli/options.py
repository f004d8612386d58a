"""The command line's parser and the options its commands share.

`Parser` reports a usage error as `UsageError` (one line, as every other bad
input); the argument types (`mesh_shape`, `size`, `at_least`) say what is
wrong with a value; the option groups (annotations, your models, a
multi-process job, the kit's MLP description) are added by each command that
takes them. Nothing here imports JAX: the simulated device count is set
before JAX is imported.
"""

from __future__ import annotations

import argparse

OPTIMIZER_CHOICES = ('adam', 'adamw', 'sgd_momentum', 'fsdp_sgd')


class UsageError(Exception):
  """A command line argparse rejects: reported like any other bad input."""


class Parser(argparse.ArgumentParser):
  """Raises `UsageError` instead of printing usage and exiting, so usage
  errors get the same one line (and JSON) as every other bad input."""

  def __init__(self, *args, **kwargs):
    # `--js` would mean --json on success but not on a usage error: no abbreviations.
    kwargs.setdefault('allow_abbrev', False)
    super().__init__(*args, **kwargs)

  def error(self, message):
    raise UsageError(message)


def mesh_shape(text: str) -> tuple[int, ...]:
  try:
    sizes = tuple(int(part) for part in text.lower().split('x'))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f'{text!r}: write DATAxMODEL, for example 2x4 (one size per mesh axis)'
    ) from None
  if any(size < 1 for size in sizes):
    raise argparse.ArgumentTypeError(f'{text!r}: every size must be at least 1')
  return sizes


def mesh_axes(text: str) -> tuple[str, ...]:
  axes = tuple(a.strip() for a in text.split(','))
  if not all(axes) or len(set(axes)) != len(axes):
    raise argparse.ArgumentTypeError(f'{text!r}: write distinct names, e.g. data,model')
  return axes


_SIZE_UNITS = {'': 1, 'b': 1, 'k': 2**10, 'kib': 2**10, 'm': 2**20, 'mib': 2**20, 'g': 2**30, 'gib': 2**30}


def byte_size(text: str) -> int:
  """An argparse type: a number of bytes, such as 1GiB, 512MiB or 1073741824."""
  import re

  match = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*', text)
  unit = match and match.group(2).lower()
  if not match or unit not in _SIZE_UNITS:
    raise argparse.ArgumentTypeError(
        f'{text!r} is not a size: give bytes, or a number with KiB, MiB or GiB (e.g. 1GiB)'
    )
  value = int(float(match.group(1)) * _SIZE_UNITS[unit])
  if value < 2**20:
    raise argparse.ArgumentTypeError(f'{text!r} is below the minimum 1MiB')
  return value


byte_size.__name__ = 'size'  # argparse: "invalid size value"


def at_least(minimum: int):
  """An argparse type: an integer no smaller than `minimum`."""

  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f'{text!r} is not an integer') from None
    if value < minimum:
      raise argparse.ArgumentTypeError(f'{value} is below the minimum {minimum}')
    return value

  parse.__name__ = f'integer >= {minimum}'
  return parse


def annotation_options(group) -> None:
  group.add_argument(
      '--layer-partition', default=None,
      help='partition name of the stacked layer axis (default: none)',
  )
  group.add_argument('--annotation', choices=('device', 'logical'), default='device')
  group.add_argument(
      '--rules', default=None, metavar='guide|fsdp|pkg.module:RULES',
      help="logical rule set: the kit MLP's (guide, the default, or fsdp; with "
      '--annotation logical), or your models\' logical axis rules',
  )
  group.add_argument('--mesh', type=mesh_shape, default=(2, 4), help='DATAxMODEL')
  group.add_argument(
      '--mesh-axes', type=mesh_axes, default=None, metavar='data,model',
      help="your models' mesh axis names, one per size of --mesh (default: data,model)",
  )
  group.add_argument(
      '--devices', type=at_least(1), default=8,
      help='simulated CPU devices (ignored unless JAX runs on CPU)',
  )


def checkpoint_options() -> argparse.ArgumentParser:
  parser = Parser(add_help=False)
  group = parser.add_argument_group(
      'mesh and annotations (a checkpoint stores arrays, not their annotations)'
  )
  annotation_options(group)
  parser.add_argument('--json', action='store_true', help='print a JSON summary on stdout')
  return parser


def model_options(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group(
      'your models (default: the kit\'s MLP, described by the checkpoint)',
      'Name each object as pkg.module:attribute; the current directory is on '
      'the import path.',
  )
  group.add_argument(
      '--linen-model', metavar='pkg.module:factory',
      help='a function returning converters.LinenModel(module, *example_inputs); '
      "it may take layout='scan'|'loop'",
  )
  group.add_argument(
      '--nnx-model', metavar='pkg.module:factory',
      help="a function returning the NNX module; it may take layout='scan'|'loop'",
  )
  group.add_argument(
      '--paths', metavar='pkg.module:MAPPING|infer', action='append',
      help="the Linen <-> NNX PathMapping (default: every path kept); 'infer' "
      'derives it from what the two models compute and proves it by running them '
      '(see linen-nnx map); both (--paths pkg.module:KNOWN --paths infer): the '
      'rules you know, the rest inferred',
  )
  group.add_argument(
      '--collections', metavar='pkg.module:COLLECTIONS',
      help="{'collection': nnx.Variable subclass} for your models' own collections "
      'beyond params, batch_stats and cache',
  )


def distributed_options(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group(
      'multi-process (run the same command in every process of the job)'
  )
  group.add_argument(
      '--distributed', action='store_true',
      help='join a multi-process job with jax.distributed.initialize() (the '
      'cluster is detected from the environment: TPU, SLURM, Open MPI, ...)',
  )
  group.add_argument('--coordinator', metavar='HOST:PORT', help='implies --distributed')
  group.add_argument('--num-processes', type=int, help='with --coordinator')
  group.add_argument('--process-id', type=int, help='with --coordinator')


def description_options() -> argparse.ArgumentParser:
  parser = Parser(add_help=False)
  group = parser.add_argument_group('model description')
  group.add_argument('--layers', type=int, default=4, help='number of DotReluDot layers')
  group.add_argument('--depth', type=int, default=1024, help='width of every layer')
  group.add_argument('--batch', type=int, default=8, help='global batch size')
  group.add_argument('--scan', action='store_true', help='stack and scan the layers')
  group.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
  annotation_options(group)
  return parser


def description_from_args(args: argparse.Namespace):
  """The kit's MLP as the description options give it (`ModelDescription`);
  `InvalidDescriptionError` saying which option is wrong, else."""
  from kit_mlp.description import RULE_SETS, InvalidDescriptionError, ModelDescription

  if args.rules not in (None, *RULE_SETS):
    raise InvalidDescriptionError(f'--rules {args.rules}: choose one of {", ".join(RULE_SETS)}')
  if args.mesh_axes is not None or len(args.mesh) != 2:
    raise InvalidDescriptionError(
        "the kit's MLP runs on a ('data', 'model') mesh: give --mesh DATAxMODEL "
        'and no --mesh-axes'
    )
  return ModelDescription(
      num_layers=args.layers,
      depth=args.depth,
      batch=args.batch,
      use_scan=args.scan,
      layer_partition=args.layer_partition,
      annotation=args.annotation,
      rules=RULE_SETS[args.rules or 'guide'],
      mesh_shape=args.mesh,
      dtype=args.dtype,
  )
