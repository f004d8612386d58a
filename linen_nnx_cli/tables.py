"""Tables on the command line: rich's on a terminal, the plain layout in logs and pipes.

On a terminal a table gets rich's box and a bold header; anywhere else
(`--json` aside, which prints no table) it is the plain layout of
`converters.testing.tables`, so logs, pipes and the tests read stable text.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from converters.testing.tables import format_table

if TYPE_CHECKING:
  from converters.checkpoint.compare import LeafComparison


def print_table(header: list[str], rows: list[list[str]], file: TextIO | None = None) -> None:
  """Prints a table to `file` (stdout by default)."""
  file = file if file is not None else sys.stdout
  console = Console(file=file)
  if not console.is_terminal:
    print(format_table(header, rows), file=file)
    return
  table = Table(box=box.SIMPLE_HEAD, header_style='bold', pad_edge=False)
  for name in header:
    table.add_column(Text(name), overflow='fold')
  for row in rows:
    table.add_row(*(Text(cell) for cell in row))
  console.print(table)


def comparison_rows(
    rows: list[LeafComparison], labels: tuple[str, str] = ('Linen', 'NNX')
) -> tuple[list[str], list[list[str]]]:
  """Header and rows of a leaf-by-leaf comparison, for `print_table`."""
  header = [
      'Linen path', 'NNX path', 'shape', 'dtype', f'{labels[0]} spec',
      f'{labels[1]} spec', 'max |diff|', 'same',
  ]
  body = [
      [
          r.linen_path, r.nnx_path, str(r.shape), r.dtype, r.spec_a, r.spec_b,
          f'{r.max_abs_diff:.3g}', 'yes' if r.identical else 'NO',
      ]
      for r in rows
  ]
  return header, body
