"""`linen-nnx convert SRC DST --to nnx|linen`: a training-state checkpoint
streamed to the other framework (`converters.checkpoint.convert`), verified
and moved into place; SRC never modified."""

from __future__ import annotations

import argparse
import json

from linen_nnx_cli.options import (
  OPTIMIZER_CHOICES,
  byte_size,
  checkpoint_options,
  distributed_options,
  model_options,
)
from linen_nnx_cli.runtime import Needs, first_process
from linen_nnx_cli.user_models import models_options

NAME = 'convert'

def add_parser(commands) -> argparse.ArgumentParser:
  convert = commands.add_parser(
      NAME,
      parents=[checkpoint_options()],
      help='convert a training-state checkpoint between Linen and NNX',
      description=(
          'Stream an Orbax checkpoint of either implementation (or a '
          'flax.training.checkpoints one) chunk by chunk into an Orbax checkpoint '
          'the other side restores, within --memory-budget, verify it and move it '
          'into place. SRC is never modified.'
      ),
  )
  distributed_options(convert)
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
      '--memory-budget', type=byte_size, default=None, metavar='SIZE',
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
  model_options(convert)
  convert.set_defaults(run=run, needs=Needs.JOB)
  return convert


def run(args: argparse.Namespace) -> int:
  from converters.checkpoint.convert import (
    STAGES,
    CheckpointOptions,
    convert_checkpoint,
  )
  from linen_nnx_cli.kit_models import models_for
  from linen_nnx_cli.progress import Progress

  models = models_for(**models_options(args))
  with Progress(STAGES, enabled=first_process()) as progress:
    summary = convert_checkpoint(
        args.src, args.dst, args.to, models=models, layout=args.layout,
        options=CheckpointOptions(
            seed=args.seed, force=args.force, allow_unfinished=args.allow_unfinished,
            in_memory=args.in_memory, memory_budget=args.memory_budget, on_stage=progress.stage,
        ),
    )
  summary = {'ok': True, **summary, 'seconds': {k: round(v, 3) for k, v in progress.timings.items()}}
  if not first_process():
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
