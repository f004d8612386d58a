"""Plain-text tables for the command line and the equivalence assertions."""

from __future__ import annotations


def format_table(header: list[str], rows: list[list[str]], rule: bool = True) -> str:
  """Left-aligned columns, a dashed rule under the header."""
  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
  line = lambda r: '  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
  ruler = [line(['-' * w for w in widths])] if rule else []
  return '\n'.join([line(header)] + ruler + [line(r) for r in rows])
