"""`tests/conftest.py`'s `CI_EVERY_NTH` names parametrized tests that exist: a
test renamed or no longer parametrized would otherwise run every case in CI,
and the entry would go on naming nothing."""

from __future__ import annotations

import ast
import pathlib

from tests.conftest import CI_EVERY_NTH

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_entry_names_a_parametrized_test_and_a_share_of_its_cases():
  for nodeid, every in CI_EVERY_NTH.items():
    path, name = nodeid.split('::')
    functions = [
        node for node in ast.parse((ROOT / path).read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == name
    ]
    assert len(functions) == 1, f'{nodeid}: no such test'
    assert any('parametrize' in ast.unparse(d) for d in functions[0].decorator_list), (
        f'{nodeid}: not parametrized, so every n-th case is every case')
    assert isinstance(every, int) and every >= 2, nodeid
