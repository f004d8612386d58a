"""`model_zoo.paths`: the tables are well-formed plain data.

Their contents are checked against the real models by the model tests.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from model_zoo import paths

TABLES = {
    'CNN': paths.CNN, 'RESNET': paths.RESNET, 'TRANSFORMER': paths.TRANSFORMER, 'RNN': paths.RNN,
    'RNN_OPTIMIZED_CELL': paths.RNN_OPTIMIZED_CELL,
    'TRANSFORMER_FUSED_ATTENTION': paths.transformer_fused_attention(4),
}


@pytest.mark.parametrize('name', TABLES)
def test_rows_are_well_formed(name):
  for collection, rows in TABLES[name].items():
    assert collection in ('params', 'batch_stats', 'cache')
    linen = [p for row in rows for p in (row.linen if isinstance(row, paths.FusedRow) else (row.linen,))]
    assert len(linen) == len(set(linen)), f'{name}/{collection}: a Linen path twice'
    for column in range(1, 4):
      values = [row.nnx if column == 1 else row[column] for row in rows
                if (column == 1 or isinstance(row, paths.Row)) and row[column] is not None]
      assert len(values) == len(set(values)), f'{name}/{collection}: a path twice in column {column}'
    for row in rows:
      if isinstance(row, paths.FusedRow):
        assert len(row.linen) > 1 and '->' in row.pattern, row
        assert all(('{i}' in p) == ('{i}' in row.nnx) for p in row.linen), row
        assert (row.linen_stacked is None) == (row.nnx_stacked is None), row
        continue
      assert isinstance(row, paths.Row)
      assert ('{i}' in row.linen) == ('{i}' in row.nnx), row
      assert (row.linen_stacked is None) == (row.nnx_stacked is None), row
      if row.linen_stacked is not None:
        assert '{i}' in row.linen and '{i}' not in row.linen_stacked + row.nnx_stacked, row


def test_only_the_transformer_stacks_and_its_stacked_nnx_paths_drop_the_index():
  for name, table in TABLES.items():
    stacked = [row for rows in table.values() for row in rows if getattr(row, 'nnx_stacked', None) is not None]
    if not name.startswith('TRANSFORMER'):
      assert not stacked
      continue
    looped = [row for rows in table.values() for row in rows if '{i}' in row.nnx]
    assert stacked == looped
    for row in stacked:
      assert row.nnx_stacked == row.nnx.replace('{i}/', ''), row
      linen, linen_stacked = (
          (row.linen, row.linen_stacked) if isinstance(row, paths.Row) else (row.linen[0], row.linen_stacked[0])
      )
      assert linen_stacked.startswith('ScanCheckpointBlock_0/'), row
      assert linen.replace('Block_{i}/', 'ScanCheckpointBlock_0/') == linen_stacked, row


def test_the_tables_are_plain_data():
  tree = ast.parse(pathlib.Path(paths.__file__).read_text())
  imported = {
      alias.name if isinstance(node, ast.Import) else node.module
      for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
      for alias in node.names
  }
  assert imported <= {'__future__', 'typing'}
