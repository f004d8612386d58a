"""Tests of the `linen-nnx` command line, run as users run it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from converters.cli import build_parser


def linen_nnx(*args: str) -> subprocess.CompletedProcess:
  # A fresh process: --devices must take effect before JAX starts.
  return subprocess.run(
      [sys.executable, '-m', 'converters.cli', *args],
      capture_output=True, text=True, timeout=600,
  )


def test_demo_prints_mesh_parameter_table_and_identical_losses():
  result = linen_nnx(
      'demo', '--devices', '8', '--layers', '2', '--depth', '64',
      '--scan', '--annotation', 'logical', '--layer-partition', 'layer',
      '--rules', 'fsdp', '--mesh', '4x2', '--steps', '3',
  )
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert 'Mesh data=4 x model=2 over 8 cpu devices' in out
  assert (
      "params/ScanDotReluDot_0/Dense_0/kernel  model/layers/dot1/kernel  (2, 64, 64)"
      "  P(None, 'data', 'model')  P(None, 'data', 'model')"
  ) in out
  loss_rows = [l.split() for l in out.splitlines() if l[:1].isdigit() and len(l.split()) == 4]
  assert [r[0] for r in loss_rows] == ['1', '2', '3']
  # Both sides start from the same (converted) parameters: identical losses.
  assert all(r[1] == r[2] and r[3] == 'yes' for r in loss_rows)


def test_demo_sets_the_device_count_before_jax_starts():
  result = linen_nnx('demo', '--devices', '4', '--mesh', '2x2', '--depth', '64', '--steps', '1')
  assert result.returncode == 0, result.stderr
  assert 'over 4 cpu devices' in result.stdout


def test_invalid_description_exits_2_and_names_the_value():
  result = linen_nnx('demo', '--depth', '30', '--steps', '1')
  assert result.returncode == 2
  assert 'depth=30 is not divisible' in result.stderr


@pytest.mark.parametrize('bad', ['2by4', '2x', 'x4'])
def test_bad_mesh_flag_is_a_usage_error(bad, capsys):
  with pytest.raises(SystemExit) as info:
    build_parser().parse_args(['demo', '--mesh', bad])
  assert info.value.code == 2
  assert 'write DATAxMODEL' in capsys.readouterr().err
