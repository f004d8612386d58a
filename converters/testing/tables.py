"""Plain-text tables for assertion messages and logs, laid out by rich.

Left-aligned columns two spaces apart, a dashed rule under the header, no
trailing spaces: a table that reads the same in a terminal, a CI log and a
pytest failure message.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text


def plain_table(header: list[str], rows: list[list[str]]) -> Table:
  """A rich `Table` in the plain layout (the dashed rule is its first row)."""
  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
  table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style=None)
  for name in header:
    table.add_column(Text(name), no_wrap=True, overflow='ignore')
  for row in [['-' * w for w in widths]] + rows:
    table.add_row(*(Text(cell) for cell in row))
  return table


def format_table(header: list[str], rows: list[list[str]]) -> str:
  """The plain table as text."""
  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
  out = io.StringIO()
  # Wide enough that rich never wraps or truncates a cell.
  console = Console(file=out, width=sum(widths) + 2 * len(widths) + 1, color_system=None)
  console.print(plain_table(header, rows))
  return '\n'.join(line.rstrip() for line in out.getvalue().splitlines())
