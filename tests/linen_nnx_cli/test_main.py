"""Tests of the `linen-nnx` command line, run as users run it (the demo as
`make demo` runs it, which README.md and docs/getting_started.md show)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import warm_python
from tests.linen_nnx_cli.runner import assert_refused, run


def linen_nnx(*args: str) -> subprocess.CompletedProcess:
  # A fresh process: --devices must take effect before JAX starts.
  return subprocess.run(
      warm_python.command([sys.executable, '-m', 'linen_nnx_cli.main', *args]),
      capture_output=True, text=True, timeout=600,
  )


def test_demo_prints_mesh_parameter_table_and_identical_losses():
  result = linen_nnx(
      # As `make demo` runs it (8 devices), at the kit MLP's configuration the
      # tests of linen_impl and nnx_impl compile (MATRIX case 7), no plot
      # (test_plot.py's). That --devices takes effect in a fresh process is
      # test_multiprocess.py::test_cli_convert_runs_as_one_job_of_two_processes's.
      'demo', '--devices', '8', '--layers', '2', '--depth', '64',
      '--scan', '--annotation', 'logical', '--layer-partition', 'layer',
      '--rules', 'fsdp', '--mesh', '1x8', '--steps', '3', '--plot', '',
  )
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert 'Mesh data=1 x model=8 over 8 cpu devices' in out
  assert (
      "params/ScanDotReluDot_0/Dense_0/kernel  model/layers/dot1/kernel  (2, 64, 64)"
      "  P(None, 'data', 'model')  P(None, 'data', 'model')"
  ) in out
  loss_rows = [l.split() for l in out.splitlines() if l[:1].isdigit() and len(l.split()) == 4]
  assert [r[0] for r in loss_rows] == ['1', '2', '3']
  # Both sides start from the same (converted) parameters: identical losses.
  assert all(r[1] == r[2] and r[3] == 'yes' for r in loss_rows)


def test_the_executable_recycles_large_buffers_and_main_inside_a_program_does_not(monkeypatch, tmp_path):
  from converters import allocator
  from linen_nnx_cli import main as cli

  calls = []
  monkeypatch.setattr(allocator, 'recycle_large_buffers', lambda: calls.append(1) or True)
  args = ['convert', str(tmp_path / 'missing'), str(tmp_path / 'out'), '--to', 'nnx']
  assert cli.main(args) == 2 and calls == []  # a program's allocator is its own
  monkeypatch.setattr(sys, 'argv', ['linen-nnx', *args])
  assert cli.entry_point() == 2 and calls == [1]


def test_invalid_description_exits_2_and_names_the_value():
  # In the test process: a fresh process's exit is test_main_checkpoints.py::test_usage_error_exits_2's.
  assert_refused(run('demo', '--depth', '30', '--steps', '1'), 'depth=30 is not divisible')


@pytest.mark.parametrize('bad, message', [
    ('2by4', 'write DATAxMODEL'), ('2x', 'write DATAxMODEL'), ('x4', 'write DATAxMODEL'),
    ('abc', 'write DATAxMODEL'), ('0x8', 'every size must be at least 1'),
])
def test_bad_mesh_flag_is_a_usage_error(bad, message):
  assert_refused(run('demo', '--mesh', bad), f'argument --mesh: {bad!r}: {message}')
  result = run('convert', 'a', 'b', '--to', 'nnx', '--mesh', bad, '--json')
  assert_refused(result, f'argument --mesh: {bad!r}: {message}')
  assert result.json['ok'] is False


# Every usage error: exit 2, one line on stderr, and the JSON object with --json.
USAGE_ERRORS = {
    'convert without --to': (['convert', 'a', 'b'], 'required: --to'),
    'convert with a bad --to': (['convert', 'a', 'b', '--to', 'jax'], "invalid choice: 'jax'"),
    'compare with one path': (['compare', 'a'], 'compare takes two checkpoints'),
    'compare with three paths': (['compare', 'a', 'b', 'c'], 'compare takes two checkpoints'),
    'compare --steps -2': (['compare', '--steps', '-2'], '--steps: -2 is below the minimum 0'),
    'demo --steps -1': (['demo', '--steps', '-1'], '--steps: -1 is below the minimum 0'),
    'demo --devices 0': (['demo', '--devices', '0'], '--devices: 0 is below the minimum 1'),
    'convert --devices x': (['convert', 'a', 'b', '--to', 'nnx', '--devices', 'x'], "'x' is not an integer"),
    'demo --plot into a missing directory': (['demo', '--plot', '/no/such/dir/loss.png'], 'does not exist'),
    'demo --plot onto a directory': (['demo', '--plot', '.'], 'is a directory'),
    'side-by-side --html into a missing directory': (['side-by-side', '--html', '/no/such/dir/x.html'], 'does not exist'),
    'no command': ([], 'required: command'),
    'an unknown command': (['transpile'], "invalid choice: 'transpile'"),
    'port without its factory': (['port'], 'required: FACTORY, --out'),
    'an abbreviated option': (['compare', 'a', 'b', '--js'], 'unrecognized arguments: --js'),
    'an option before the command': (
        ['--devices', '8', 'convert', 'a', 'b', '--to', 'nnx'],
        '--devices comes before the command; options go after it: linen-nnx convert ... --devices ...',
    ),
}


@pytest.mark.parametrize('name', USAGE_ERRORS)
def test_usage_errors_exit_2_with_one_line_and_json(name):
  argv, message = USAGE_ERRORS[name]
  result = run(*argv)
  assert_refused(result, message)
  assert result.stdout == ''
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  if 'side-by-side' in argv or 'demo' in argv:
    return  # these commands print no JSON
  result = run(*argv, '--json')
  assert_refused(result, message)
  assert result.json['ok'] is False and result.json['exit_code'] == 2
