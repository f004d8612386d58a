"""`linen-nnx side-by-side`: the kit's Linen and NNX code paired by concept,
generated from their source (`linen_nnx_cli.side_by_side`), as Markdown or
HTML; it reads source files only (no JAX, no devices)."""

from __future__ import annotations

import argparse
import sys

from linen_nnx_cli.failures import fail, unwritable_file
from linen_nnx_cli.runtime import Needs

NAME = 'side-by-side'

def add_parser(commands) -> argparse.ArgumentParser:
  side = commands.add_parser(
      NAME,
      help='the Linen and NNX code paired by concept, generated from the source',
  )
  side.add_argument('--html', metavar='PATH', help='write the two-column HTML page here')
  side.add_argument('--markdown', metavar='PATH', help='write the Markdown page here')
  side.set_defaults(run=run, needs=Needs.NOTHING)
  return side


def run(args: argparse.Namespace) -> int:
  from linen_nnx_cli import side_by_side

  try:
    pages = {'markdown': side_by_side.render_markdown(), 'html': side_by_side.render_html()}
  except side_by_side.SideBySideError as e:
    return fail(args, str(e), 2)
  written = False
  for kind in ('markdown', 'html'):
    path = getattr(args, kind)
    if path:
      problem = unwritable_file(path)
      if problem:
        return fail(args, f'--{kind} {path}: {problem}', 2)
      with open(path, 'w') as f:
        f.write(pages[kind])
      print(f'wrote {path}')
      written = True
  if not written:
    sys.stdout.write(pages['markdown'])
  return 0
