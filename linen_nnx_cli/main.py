"""The `linen-nnx` command line.

    linen-nnx demo [--devices 8] [--layers 4] [--depth 1024] [--scan] ...
    linen-nnx convert SRC DST --to nnx|linen [--layout scan|loop] [--mesh 2x4]
                      [--linen-model pkg.mod:factory --nnx-model pkg.mod:factory
                       --paths pkg.mod:MAPPING --optimizer pkg.mod:make_tx]
                      [--force] [--json]
    linen-nnx compare [A B] [--mesh 2x4] [model options] [--json]   (two checkpoints)
    linen-nnx compare [--layers 4 ...] [--steps 3]  (a model description)
    linen-nnx side-by-side [--markdown PATH] [--html PATH]
    linen-nnx port pkg.mod:factory --out models_nnx.py [--side-by-side port.html]

Options that describe the kit's MLP map one to one onto `ModelDescription`;
`--linen-model` and `--nnx-model` name a user's models instead
(`linen_nnx_cli.user_models`). The
simulated CPU device count is set before JAX is imported, so this module imports
nothing from JAX at load time.

Exit codes: 0 success; 1 a verification or comparison found a difference; 2 bad
usage or bad input. Every failure prints one line saying why on stderr (and,
with --json, a JSON object with "error" on stdout).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence

from linen_nnx_cli import port_command
from linen_nnx_cli.devices import simulate_cpu_devices


OPTIMIZER_CHOICES = ('adam', 'adamw', 'sgd_momentum', 'fsdp_sgd')
COMMANDS = ('demo', 'convert', 'compare', 'map', 'side-by-side', 'port')


class UsageError(Exception):
  """A command line argparse rejects: reported like any other bad input."""


class _Parser(argparse.ArgumentParser):
  """Raises `UsageError` instead of printing usage and exiting, so usage
  errors get the same one line (and JSON) as every other bad input."""

  def __init__(self, *args, **kwargs):
    # `--js` would mean --json on success but not on a usage error: no abbreviations.
    kwargs.setdefault('allow_abbrev', False)
    super().__init__(*args, **kwargs)

  def error(self, message):
    raise UsageError(message)


def _mesh_shape(text: str) -> tuple[int, ...]:
  try:
    sizes = tuple(int(part) for part in text.lower().split('x'))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f'{text!r}: write DATAxMODEL, for example 2x4 (one size per mesh axis)'
    ) from None
  if any(size < 1 for size in sizes):
    raise argparse.ArgumentTypeError(f'{text!r}: every size must be at least 1')
  return sizes


def _mesh_axes(text: str) -> tuple[str, ...]:
  axes = tuple(a.strip() for a in text.split(','))
  if not all(axes) or len(set(axes)) != len(axes):
    raise argparse.ArgumentTypeError(f'{text!r}: write distinct names, e.g. data,model')
  return axes


_SIZE_UNITS = {'': 1, 'b': 1, 'k': 2**10, 'kib': 2**10, 'm': 2**20, 'mib': 2**20, 'g': 2**30, 'gib': 2**30}


def _size(text: str) -> int:
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


_size.__name__ = 'size'


def _at_least(minimum: int):
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


def _annotation_options(group) -> None:
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
  group.add_argument('--mesh', type=_mesh_shape, default=(2, 4), help='DATAxMODEL')
  group.add_argument(
      '--mesh-axes', type=_mesh_axes, default=None, metavar='data,model',
      help="your models' mesh axis names, one per size of --mesh (default: data,model)",
  )
  group.add_argument(
      '--devices', type=_at_least(1), default=8,
      help='simulated CPU devices (ignored unless JAX runs on CPU)',
  )


def _checkpoint_options() -> argparse.ArgumentParser:
  parser = _Parser(add_help=False)
  group = parser.add_argument_group(
      'mesh and annotations (a checkpoint stores arrays, not their annotations)'
  )
  _annotation_options(group)
  parser.add_argument('--json', action='store_true', help='print a JSON summary on stdout')
  return parser


def _model_options(parser: argparse.ArgumentParser) -> None:
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


def _distributed_options(parser: argparse.ArgumentParser) -> None:
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


def _joins_a_job(args: argparse.Namespace) -> bool:
  return bool(getattr(args, 'distributed', False) or getattr(args, 'coordinator', None))


def _join(args: argparse.Namespace) -> None:
  """`jax.distributed.initialize` when asked; gloo collectives for CPU devices."""
  if not _joins_a_job(args):
    return
  import jax

  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(
      args.coordinator, args.num_processes, args.process_id, initialization_timeout=120
  )


def _description_options() -> argparse.ArgumentParser:
  parser = _Parser(add_help=False)
  group = parser.add_argument_group('model description')
  group.add_argument('--layers', type=int, default=4, help='number of DotReluDot layers')
  group.add_argument('--depth', type=int, default=1024, help='width of every layer')
  group.add_argument('--batch', type=int, default=8, help='global batch size')
  group.add_argument('--scan', action='store_true', help='stack and scan the layers')
  group.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
  _annotation_options(group)
  return parser


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(
      prog='linen-nnx',
      description='Port a sharded Flax Linen model to NNX and prove nothing changed.',
  )
  commands = parser.add_subparsers(dest='command', required=True)
  demo = commands.add_parser(
      'demo',
      parents=[_description_options()],
      help='both implementations side by side on one mesh',
  )
  demo.add_argument('--steps', type=_at_least(0), default=10, help='training steps')
  demo.add_argument(
      '--plot', metavar='PATH', default='linen-nnx-demo.png',
      help='PNG of both loss curves (needs the plot extra: matplotlib)',
  )
  demo.add_argument('--optimizer', default='adam', choices=OPTIMIZER_CHOICES)

  convert = commands.add_parser(
      'convert',
      parents=[_checkpoint_options()],
      help='convert a training-state checkpoint between Linen and NNX',
      description=(
          'Stream an Orbax checkpoint of either implementation (or a '
          'flax.training.checkpoints one) chunk by chunk into an Orbax checkpoint '
          'the other side restores, within --memory-budget, verify it and move it '
          'into place. SRC is never modified.'
      ),
  )
  _distributed_options(convert)
  convert.add_argument(
      'src', metavar='SRC',
      help='the checkpoint to read: an Orbax directory, or a flax.training.checkpoints '
      'file or directory (its newest step); never modified')
  convert.add_argument(
      'dst', metavar='DST', help='where to write the converted Orbax checkpoint (absent, or see --force)')
  convert.add_argument('--to', choices=('nnx', 'linen'), required=True)
  convert.add_argument(
      '--layout', choices=('scan', 'loop'), default=None,
      help='layer layout of DST (default: as SRC)',
  )
  convert.add_argument(
      '--force', action='store_true',
      help='replace an existing DST: a checkpoint, a file, a symlink (the link, '
      'not its target) or an empty directory',
  )
  convert.add_argument(
      '--allow-unfinished', action='store_true',
      help='read an Orbax save of SRC that never finished (its arrays may be incomplete)',
  )
  convert.add_argument(
      '--memory-budget', type=_size, default=None, metavar='SIZE',
      help='hold at most this much array data at once while streaming SRC to DST '
      '(default 1GiB; a single chunk larger than it is moved alone)',
  )
  convert.add_argument(
      '--in-memory', action='store_true',
      help='restore SRC onto the devices, convert it there and save it, instead of '
      'streaming it chunk by chunk from disk to disk (not with --memory-budget)',
  )
  convert.add_argument(
      '--optimizer', default=None, metavar='NAME|pkg.module:make_tx',
      help='what SRC was trained with: for your models, a function returning the '
      f'optax transform; for the kit\'s MLP, one of {", ".join(OPTIMIZER_CHOICES)} '
      'when its state cannot say (adamw vs adam in NNX)',
  )
  convert.add_argument(
      '--seed', type=int, default=0,
      help='seed of the RNG streams (dropout) of an NNX DST, which Linen has not',
  )
  _model_options(convert)

  compare = commands.add_parser(
      'compare',
      parents=[_description_options()],
      help='compare Linen and NNX leaf by leaf: two checkpoints, or a description',
      description=(
          'With two checkpoints A and B: read both and compare every parameter '
          'and optimizer-state leaf. Without: build both implementations of the '
          'described model from identical parameters, train --steps steps on '
          'each and compare. Exit 0 when identical, 1 when not.'
      ),
  )
  _distributed_options(compare)
  compare.add_argument(
      'checkpoints', nargs='*', metavar='A B',
      help='two checkpoints to compare; none: compare the two implementations of a description')
  compare.add_argument(
      '--allow-unfinished', action='store_true',
      help='read Orbax saves that never finished (their arrays may be incomplete)',
  )
  compare.add_argument(
      '--steps', type=_at_least(0), default=3, help='training steps (description)'
  )
  compare.add_argument(
      '--optimizer', default=None, metavar='NAME|pkg.module:make_tx',
      help=f'a description\'s optimizer ({", ".join(OPTIMIZER_CHOICES)}; default adam), '
      "or your models' optax transform",
  )
  _model_options(compare)
  compare.add_argument(
      '--outputs', action='store_true',
      help='with two checkpoints and your models: restore each into its own '
      "framework's model and compare their outputs on the Linen model's example "
      'inputs, on them made generic and with selectors drawn anew, their gradients, '
      'and their outputs in training: a check independent of any path mapping',
  )
  compare.add_argument('--json', action='store_true', help='print a JSON report on stdout')
  map_ = commands.add_parser(
      'map',
      help='print the path mapping of your Linen model and its NNX port, inferred '
      'from what they compute',
      description=(
          'Trace both models abstractly (no parameter is materialised), pair every '
          'variable by where the computation uses it, and print the PathMapping as '
          'Python to keep (or --json). Rules given with --paths take precedence.'
      ),
  )
  _annotation_options(map_.add_argument_group('mesh and annotations'))
  _model_options(map_)
  map_.add_argument('--layout', choices=('scan', 'loop'), default=None,
                    help='the layout to make both models in (their factories take layout=)')
  map_.add_argument('--name', default='PATHS', help='the variable name of the printed mapping')
  map_.add_argument('--json', action='store_true', help='print the rules as JSON on stdout')
  side = commands.add_parser(
      'side-by-side',
      help='the Linen and NNX code paired by concept, generated from the source',
  )
  side.add_argument('--html', metavar='PATH', help='write the two-column HTML page here')
  side.add_argument('--markdown', metavar='PATH', help='write the Markdown page here')
  port_command.add_parser(commands)
  return parser


def description_from_args(args: argparse.Namespace):
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


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
  """Runs one command; its exit code.

  `own_process`: the process is the command's alone (the installed
  executable), so glibc is set to recycle large buffers
  (`converters.allocator.recycle_large_buffers`); never when the command runs
  inside another program, whose allocator is its own.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = build_parser()
  try:
    args = parser.parse_args(argv)
  except UsageError as e:
    return _usage_failure(argv, str(e))
  if args.command == 'side-by-side':
    return _side_by_side(args)
  if os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
    try:
      simulate_cpu_devices(args.devices)
    except (ValueError, RuntimeError) as e:
      return _fail(args, f'--devices {args.devices}: {e}', 2)
  if args.command == 'port':
    return port_command.run(args, _fail)
  if own_process:
    from converters.allocator import recycle_large_buffers

    recycle_large_buffers()
  if args.command == 'compare' and len(args.checkpoints) not in (0, 2):
    return _fail(args, 'compare takes two checkpoints A B, or none (a description)', 2)
  if args.command == 'compare' and args.outputs and not args.checkpoints:
    return _fail(args, '--outputs compares the models two checkpoints restore into: give A B', 2)
  if args.command == 'demo' and args.plot:
    problem = _unwritable_file(args.plot)
    if problem:
      return _fail(args, f'--plot {args.plot}: {problem}', 2)
  from kit_mlp.description import InvalidDescriptionError
  from converters.errors import ConversionError, VerificationError

  if getattr(args, 'json', False) and _joins_a_job(args):
    _keep_stdout_for_json()
  # Orbax logs a failed background write (a full disk) with tracebacks from
  # each of its threads and tasks; the command reports the failure itself, in
  # one line.
  for logger in ('absl', 'asyncio'):
    logging.getLogger(logger).setLevel(logging.CRITICAL)
  warnings.filterwarnings('ignore', "coroutine '.*' was never awaited", RuntimeWarning)
  try:
    _join(args)
  except Exception as e:  # jax.distributed raises several types
    return _fail(args, f'cannot join the multi-process job: {e}', 2)
  try:
    if args.command == 'convert':
      return _convert(args)
    if args.command == 'map':
      return _map(args)
    if args.command == 'compare' and args.checkpoints:
      return _compare_checkpoints(args)
    try:
      desc = description_from_args(args)
    except InvalidDescriptionError as e:
      return _fail(args, f'invalid model description: {e}', 2)
    if args.command == 'compare':
      return _compare_description(args, desc)
    if args.command == 'demo':
      from linen_nnx_cli.demo import run_demo

      try:
        return run_demo(desc, steps=args.steps, optimizer=args.optimizer, plot=args.plot)
      except OSError as e:  # the plot could not be written after all
        return _fail(args, f'--plot {args.plot}: {e.strerror or e}', 2)
  except VerificationError as e:
    return _fail(args, str(e), 1)
  except (ConversionError, InvalidDescriptionError) as e:
    return _fail(args, str(e), 2)
  raise AssertionError(args.command)


def _unwritable_file(path: str) -> str | None:
  """Why a file cannot be written at `path`, or None."""
  if os.path.isdir(path):
    return 'is a directory; give a file name such as losses.png'
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    return f'the directory {parent} does not exist; create it or choose another path'
  if not os.access(parent, os.W_OK | os.X_OK):
    return f'the directory {parent} is not writable'
  return None


def _usage_failure(argv: list[str], message: str) -> int:
  """A usage error: one line on stderr, JSON on stdout with --json; exit 2."""
  command = next((a for a in argv if a in COMMANDS), None)
  args = argparse.Namespace(command=command or '', json='--json' in argv)
  if command and argv[0].startswith('-') and argv[0] not in ('-h', '--help'):
    # argparse took the option's value for the command: say what went wrong.
    message = f'{argv[0]} comes before the command; options go after it: linen-nnx {command} ... {argv[0]} ...'
  hint = f'linen-nnx {command} --help' if command else 'linen-nnx --help'
  return _fail(args, f'{message} (see {hint})', 2)


def _fail(args: argparse.Namespace, reason: str, code: int) -> int:
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


def _keep_stdout_for_json() -> None:
  """Sends what native libraries print to stdout (gloo does, in a
  multi-process job) to stderr.

  Python's `sys.stdout` keeps the real stdout, so `--json` output stays
  machine-readable.
  """
  sys.stdout.flush()
  real_stdout = os.dup(1)
  os.dup2(2, 1)
  sys.stdout = os.fdopen(real_stdout, 'w', buffering=1)


def _first_process() -> bool:
  import jax

  return jax.process_index() == 0


def _models(args: argparse.Namespace) -> dict:
  from linen_nnx_cli.user_models import models_options

  return models_options(args)


def _convert(args: argparse.Namespace) -> int:
  from converters.checkpoint.convert import STAGES, CheckpointOptions, convert_checkpoint
  from linen_nnx_cli.kit_models import models_for
  from linen_nnx_cli.progress import Progress

  models = models_for(**_models(args))
  with Progress(STAGES, enabled=_first_process()) as progress:
    summary = convert_checkpoint(
        args.src, args.dst, args.to, models=models, layout=args.layout,
        options=CheckpointOptions(
            seed=args.seed, force=args.force, allow_unfinished=args.allow_unfinished,
            in_memory=args.in_memory, memory_budget=args.memory_budget, on_stage=progress.stage,
        ),
    )
  summary = {'ok': True, **summary, 'seconds': {k: round(v, 3) for k, v in progress.timings.items()}}
  if not _first_process():
    return 0
  if args.json:
    print(json.dumps(summary, indent=2))
  else:
    source, target = summary['source'], summary['destination']
    if 'form' in source:  # weights only
      print(f"weights only: {source['form']} -> {target['form']}")
    source_form = ', '.join(str(x) for x in (source['layout'], source['format']) if x)
    target_form = f" ({target['layout']})" if target['layout'] else ''
    print(
        f"converted {source['framework']} ({source_form}) "
        f"{source['path']} -> {target['framework']}{target_form} "
        f"{target['path']}: "
        + ('' if summary['step'] is None else f"step {summary['step']}, ")
        + f"{target['leaves']} arrays, "
        f"{source['bytes'] / 2**20:.1f} MiB, verified bit for bit"
    )
    rng = summary['rng_state']
    if rng['seeded']:
      print(f"NNX RNG state seeded from --seed {rng['seed']}: {', '.join(rng['seeded'])}")
    if rng['dropped']:
      print(f"NNX RNG state dropped (Linen has none): {', '.join(rng['dropped'])}")
  return 0


def _report_comparison(args, rows, labels, extra: dict) -> int:
  from converters.checkpoint import compare
  from linen_nnx_cli import tables

  differing = sum(not r.identical for r in rows)
  identical = differing == 0
  if not _first_process():
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
        ('rng_not_compared', 'NNX RNG leaves (dropout keys and counts), which the other '
         'checkpoint holds in another form or not at all (Linen has none)'),
        ('nnx_only_not_compared', 'leaves of state only the NNX port has (a one-sided rule '
         'names them), which one checkpoint holds and the other does not'),
    ):
      if skipped := extra.get(key):
        print(f'not compared: {len(skipped)} {what}: ' + ', '.join(skipped))
  if not identical:
    print(f'linen-nnx compare: {differing} leaves differ', file=sys.stderr)
  return 0 if identical else 1


def _map(args: argparse.Namespace) -> int:
  from linen_nnx_cli.kit_models import models_for
  from converters.checkpoint.models import UserModels
  from converters.paths import as_infer

  options = _models(args)
  if 'linen_model' not in options or 'nnx_model' not in options:
    return _fail(args, 'map needs your two models: --linen-model and --nnx-model', 2)
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


def _compare_checkpoints(args: argparse.Namespace) -> int:
  from converters.checkpoint.compare import compare_checkpoints, compare_outputs
  from linen_nnx_cli.kit_models import models_for

  options = _models(args)
  if args.outputs and 'linen_model' not in options:
    return _fail(args, '--outputs runs your two models: give --linen-model and --nnx-model', 2)
  compare = compare_outputs if args.outputs else compare_checkpoints
  rows, labels, extra = compare(
      *args.checkpoints, models=models_for(**options), allow_unfinished=args.allow_unfinished
  )
  return _report_comparison(args, rows, labels, extra)


def _compare_description(args: argparse.Namespace, desc) -> int:
  from linen_nnx_cli.compare_training import compare_description

  optimizer = args.optimizer or 'adam'
  if optimizer not in OPTIMIZER_CHOICES:
    return _fail(args, f'--optimizer {optimizer}: choose one of {", ".join(OPTIMIZER_CHOICES)}', 2)
  rows, extra = compare_description(desc, optimizer, args.steps)
  return _report_comparison(args, rows, ('Linen', 'NNX'), extra)


def _side_by_side(args: argparse.Namespace) -> int:
  from linen_nnx_cli import side_by_side

  try:
    pages = {'markdown': side_by_side.render_markdown(), 'html': side_by_side.render_html()}
  except side_by_side.SideBySideError as e:
    return _fail(args, str(e), 2)
  written = False
  for kind in ('markdown', 'html'):
    path = getattr(args, kind)
    if path:
      problem = _unwritable_file(path)
      if problem:
        return _fail(args, f'--{kind} {path}: {problem}', 2)
      with open(path, 'w') as f:
        f.write(pages[kind])
      print(f'wrote {path}')
      written = True
  if not written:
    sys.stdout.write(pages['markdown'])
  return 0


def entry_point() -> int:
  """The installed `linen-nnx` executable."""
  return main(own_process=True)


if __name__ == '__main__':
  sys.exit(entry_point())
