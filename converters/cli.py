"""The `linen-nnx` command line.

    linen-nnx demo [--devices 8] [--layers 4] [--depth 1024] [--scan] ...
    linen-nnx side-by-side [--markdown PATH] [--html PATH]

Options that describe the model map one to one onto `ModelDescription`. The
simulated CPU device count is set before JAX is imported, so this module imports
nothing from JAX at load time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from converters.devices import simulate_cpu_devices


def _mesh_shape(text: str) -> tuple[int, int]:
  try:
    data, model = (int(part) for part in text.lower().split('x'))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f'--mesh {text!r}: write DATAxMODEL, for example 2x4'
    ) from None
  return data, model


def _description_options() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(add_help=False)
  group = parser.add_argument_group('model description')
  group.add_argument('--layers', type=int, default=4, help='number of DotReluDot layers')
  group.add_argument('--depth', type=int, default=1024, help='width of every layer')
  group.add_argument('--batch', type=int, default=8, help='global batch size')
  group.add_argument('--scan', action='store_true', help='stack and scan the layers')
  group.add_argument(
      '--layer-partition', default=None,
      help='partition name of the stacked layer axis (default: none)',
  )
  group.add_argument('--annotation', choices=('device', 'logical'), default='device')
  group.add_argument(
      '--rules', choices=('guide', 'fsdp'), default='guide',
      help='logical rule set (with --annotation logical)',
  )
  group.add_argument('--mesh', type=_mesh_shape, default=(2, 4), help='DATAxMODEL')
  group.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
  group.add_argument(
      '--devices', type=int, default=8,
      help='simulated CPU devices (ignored unless JAX runs on CPU)',
  )
  return parser


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='linen-nnx',
      description='Port a sharded Flax Linen model to NNX and prove nothing changed.',
  )
  commands = parser.add_subparsers(dest='command', required=True)
  demo = commands.add_parser(
      'demo',
      parents=[_description_options()],
      help='both implementations side by side on one mesh',
  )
  demo.add_argument('--steps', type=int, default=5, help='training steps')
  side = commands.add_parser(
      'side-by-side',
      help='the Linen and NNX code paired by concept, generated from the source',
  )
  side.add_argument('--html', metavar='PATH', help='write the two-column HTML page here')
  side.add_argument('--markdown', metavar='PATH', help='write the Markdown page here')
  demo.add_argument(
      '--optimizer', default='adam',
      choices=('adam', 'adamw', 'sgd_momentum', 'fsdp_sgd'),
  )
  return parser


def description_from_args(args: argparse.Namespace):
  from converters.description import RULE_SETS, ModelDescription

  return ModelDescription(
      num_layers=args.layers,
      depth=args.depth,
      batch=args.batch,
      use_scan=args.scan,
      layer_partition=args.layer_partition,
      annotation=args.annotation,
      rules=RULE_SETS[args.rules],
      mesh_shape=args.mesh,
      dtype=args.dtype,
  )


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command == 'side-by-side':
    return _side_by_side(args)
  if os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
    try:
      simulate_cpu_devices(args.devices)
    except (ValueError, RuntimeError) as e:
      parser.error(f'--devices {args.devices}: {e}')
  from converters.description import InvalidDescriptionError

  try:
    desc = description_from_args(args)
  except InvalidDescriptionError as e:
    print(f'linen-nnx: invalid model description: {e}', file=sys.stderr)
    return 2
  if args.command == 'demo':
    from converters.demo import run_demo

    return run_demo(desc, steps=args.steps, optimizer=args.optimizer)
  raise AssertionError(args.command)


def _side_by_side(args: argparse.Namespace) -> int:
  from converters import side_by_side

  try:
    pages = {'markdown': side_by_side.render_markdown(), 'html': side_by_side.render_html()}
  except side_by_side.SideBySideError as e:
    print(f'linen-nnx: {e}', file=sys.stderr)
    return 2
  written = False
  for kind in ('markdown', 'html'):
    path = getattr(args, kind)
    if path:
      with open(path, 'w') as f:
        f.write(pages[kind])
      print(f'wrote {path}')
      written = True
  if not written:
    sys.stdout.write(pages['markdown'])
  return 0


if __name__ == '__main__':
  sys.exit(main())
