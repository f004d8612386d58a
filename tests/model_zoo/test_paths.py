"""`model_zoo.paths`: the tables are well-formed plain data.

Their contents are checked against the real models by the model tests.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from model_zoo import paths

TABLES = {'CNN': paths.CNN, 'RESNET': paths.RESNET, 'TRANSFORMER': paths.TRANSFORMER, 'RNN': paths.RNN}


@pytest.mark.parametrize('name', TABLES)
def test_rows_are_well_formed(name):
  for collection, rows in TABLES[name].items():
    assert collection in ('params', 'batch_stats', 'cache')
    for column in range(4):
      values = [row[column] for row in rows if row[column] is not None]
      assert len(values) == len(set(values)), f'{name}/{collection}: a path twice in column {column}'
    for row in rows:
      assert isinstance(row, paths.Row)
      assert ('{i}' in row.linen) == ('{i}' in row.nnx), row
      assert (row.linen_stacked is None) == (row.nnx_stacked is None), row
      if row.linen_stacked is not None:
        assert '{i}' in row.linen and '{i}' not in row.linen_stacked + row.nnx_stacked, row


def test_only_the_transformer_stacks_and_its_stacked_nnx_paths_drop_the_index():
  for name, table in TABLES.items():
    stacked = [row for rows in table.values() for row in rows if row.nnx_stacked is not None]
    if name != 'TRANSFORMER':
      assert not stacked
      continue
    looped = [row for rows in table.values() for row in rows if '{i}' in row.nnx]
    assert stacked == looped
    for row in stacked:
      assert row.nnx_stacked == row.nnx.replace('{i}/', ''), row
      assert row.linen_stacked.startswith('ScanCheckpointBlock_0/'), row
      assert row.linen.replace('Block_{i}/', 'ScanCheckpointBlock_0/') == row.linen_stacked, row


def test_the_tables_are_plain_data():
  tree = ast.parse(pathlib.Path(paths.__file__).read_text())
  imported = {
      alias.name if isinstance(node, ast.Import) else node.module
      for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
      for alias in node.names
  }
  assert imported <= {'__future__', 'typing'}
