"""Tests of `linen_nnx_cli.tables` and `converters.testing.tables`: rich on a terminal, plain text elsewhere."""

from __future__ import annotations

import io

from converters.testing.tables import format_table
from linen_nnx_cli.tables import print_table

HEADER = ['parameter', 'spec']
ROWS = [['layers/0/dot1/kernel', "PartitionSpec(None, 'model')"], ['w2 [bold]', '']]


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_the_plain_layout_is_columns_two_spaces_apart_under_a_dashed_rule():
  assert format_table(HEADER, ROWS).splitlines() == [
      'parameter             spec',
      '--------------------  ----------------------------',
      "layers/0/dot1/kernel  PartitionSpec(None, 'model')",
      'w2 [bold]',  # no markup read, no trailing spaces
  ]


def test_outside_a_terminal_the_table_is_the_plain_layout():
  out = io.StringIO()
  print_table(HEADER, ROWS, file=out)
  assert out.getvalue() == format_table(HEADER, ROWS) + '\n'


def test_on_a_terminal_rich_draws_the_table_with_every_cell():
  out = Terminal()
  print_table(HEADER, ROWS, file=out)
  screen = out.getvalue()
  assert screen != format_table(HEADER, ROWS) + '\n'
  for cell in ['parameter', 'layers/0/dot1/kernel', 'w2 [bold]']:
    assert cell in screen
