"""`linen-nnx port` on the golden cases (`tests/converters/port/golden`):
what it writes for each Linen idiom, compared as text with the reviewed
port, and, nightly, each written port proven.

`UPDATE_GOLDEN=1 pytest tests/converters/port/test_golden.py` writes the
expected files anew; review their diff before committing it.
"""

from __future__ import annotations

import importlib
import os
import pathlib

import pytest

from converters.port import generate, port
from converters.port.emit import ruff_check
from tests.converters.port.golden_files import assert_same_text

GOLDEN = pathlib.Path(__file__).parent / 'golden'
PACKAGE = 'tests.converters.port.golden'
CASES = sorted(
    p.stem for p in GOLDEN.glob('*.py')
    if not p.stem.startswith('_') and not p.stem.endswith(('_nnx', '_nnx_paths'))
)


def _model(case: str):
  return importlib.import_module(f'{PACKAGE}.{case}').model()


def test_every_case_has_its_expected_port():
  assert CASES
  for case in CASES:
    assert (GOLDEN / f'{case}_nnx.py').exists() or os.environ.get('UPDATE_GOLDEN'), case


@pytest.mark.parametrize('case', CASES)
def test_the_port_writes_the_golden_text(tmp_path, case):
  result, _ = generate.write(
      _model(case), factory=f'{PACKAGE}.{case}:model', module_name=f'{case}_nnx',
      test_name=f'test_{case}_nnx_port.py')
  assert [s.cls for s in result.stubs] == list(getattr(importlib.import_module(f'{PACKAGE}.{case}'), 'STUBS', ()))
  out = tmp_path / f'{case}_nnx.py'
  out.write_text(result.text)
  findings, _ = ruff_check(str(out))  # its safe fixes, as `port` makes them
  assert not findings
  assert_same_text(GOLDEN, {f'{case}_nnx.py': out.read_text(), f'{case}_nnx_paths.py': result.paths_text})


@pytest.mark.nightly
@pytest.mark.parametrize('case', CASES)
def test_the_golden_port_is_proven(tmp_path, case):
  result = port(_model(case), str(tmp_path / f'{case}_nnx.py'), factory=f'{PACKAGE}.{case}:model')
  if result.stubs:  # what is written around them is proven on its own
    alone = [outcome for check, outcome, _ in result.checks if 'around the stubs' in check]
    assert alone and all(outcome == 'passed' for outcome in alone), result.checks
  else:
    assert result.proven, result.failure
