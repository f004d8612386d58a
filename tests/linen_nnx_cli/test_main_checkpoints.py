"""`linen-nnx convert` and `linen-nnx compare`, run as users and CI run them.

Includes the kill test: the conversion is SIGKILLed at several points while it
writes, and SRC must be intact and DST absent or complete and restorable.
What a process alone shows (exit status, output at exit, a kill) runs the
command as a process; the rest calls its `main` in this process (`runner`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import pytest

from converters.checkpoint import inspect as checkpoints
from nnx_impl import checkpoint as nnx_checkpoint
from tests import warm_python
from tests.converters.checkpoint.fixtures import (
    DESC,
    assert_bit_identical,
    trained_state,
    tree_checksum,
    write_checkpoint,
)
from tests.linen_nnx_cli.runner import run

COMMAND = [sys.executable, '-m', 'linen_nnx_cli.main']


def linen_nnx(*args) -> subprocess.CompletedProcess:
  return subprocess.run(
      warm_python.command(COMMAND + [str(a) for a in args]), capture_output=True, text=True, timeout=600
  )


@pytest.fixture(scope='module')
def linen_checkpoint(tmp_path_factory):
  path = tmp_path_factory.mktemp('src') / 'linen'
  write_checkpoint(path, 'linen', DESC, 'adam', steps=3)
  return path


def test_convert_reports_progress_and_a_json_summary(linen_checkpoint, tmp_path):
  result = linen_nnx('convert', linen_checkpoint, tmp_path / 'nnx', '--to', 'nnx', '--layout', 'scan', '--json')
  assert result.returncode == 0, result.stderr
  stages = [l.split('] ')[1] for l in result.stderr.splitlines() if l.startswith('linen-nnx: [')]
  assert stages == ['reading', 'converting', 'writing', 'verifying', 'renaming']
  summary = json.loads(result.stdout)
  assert summary['ok'] and summary['verified'] and summary['step'] == 3
  assert summary['source']['framework'] == 'linen' and summary['destination']['layout'] == 'scan'
  assert set(summary['seconds']) == set(stages)


def test_bad_input_exits_2_with_one_line_reason(linen_checkpoint, tmp_path):
  result = linen_nnx('convert', tmp_path / 'absent', tmp_path / 'out', '--to', 'nnx', '--json')
  assert result.returncode == 2
  reason = f'{tmp_path / "absent"}: no such file or directory'
  assert result.stderr.strip().splitlines()[-1] == f'linen-nnx convert: {reason}'
  # The JSON carries the same one-line reason as stderr.
  assert json.loads(result.stdout) == {'ok': False, 'exit_code': 2, 'error': reason}
  # The others in this process (the first, in a process of its own, showed the
  # whole exit: code, stderr's last line, JSON).
  (tmp_path / 'taken').mkdir()
  result = run('convert', linen_checkpoint, tmp_path / 'taken', '--to', 'nnx')
  assert result.code == 2 and 'pass --force to replace it' in result.reason
  result = run('convert', linen_checkpoint, tmp_path / 'x', '--to', 'nnx', '--mesh', '2x3')
  assert result.code == 2 and 'not divisible' in result.reason
  result = run('convert', linen_checkpoint, tmp_path / 'x', '--to', 'nnx', '--in-memory', '--memory-budget', '2GiB')
  assert result.code == 2 and 'give one of them (--memory-budget or --in-memory)' in result.reason
  assert not os.path.exists(tmp_path / 'x')


def test_usage_error_exits_2(linen_checkpoint, tmp_path):
  result = linen_nnx('convert', linen_checkpoint, tmp_path / 'x')  # no --to
  assert result.returncode == 2 and '--to' in result.stderr


def test_truncated_data_exits_2_with_one_line_and_no_tracebacks(linen_checkpoint, tmp_path):
  """Reads still in flight when Orbax gives up must not print tracebacks at exit."""
  src = tmp_path / 'src'
  shutil.copytree(linen_checkpoint, src)
  for path in (src / 'd').iterdir():
    with open(path, 'r+b') as f:
      f.truncate(100)
  result = linen_nnx('convert', src, tmp_path / 'dst', '--to', 'nnx', '--json')
  assert result.returncode == 2
  assert 'corrupted or incomplete' in result.stderr.splitlines()[-1]
  assert 'Traceback' not in result.stderr and 'Event loop is closed' not in result.stderr
  assert json.loads(result.stdout)['ok'] is False


def test_layout_change_with_a_layer_partition(linen_checkpoint, tmp_path):
  result = run('convert', linen_checkpoint, tmp_path / 'scan', '--to', 'nnx', '--layout', 'scan', '--layer-partition', 'data')
  assert result.code == 0, result.stderr
  result = run('convert', tmp_path / 'scan', tmp_path / 'loop', '--to', 'linen', '--layout', 'loop', '--layer-partition', 'data')
  assert result.code == 0, result.stderr
  result = run('convert', tmp_path / 'loop', tmp_path / 'x', '--to', 'nnx', '--layer-partition', 'data')
  assert result.code == 2 and 'no side is scanned' in result.stderr


def test_compare_checkpoints_identical_and_different(linen_checkpoint, tmp_path):
  assert run('convert', linen_checkpoint, tmp_path / 'nnx', '--to', 'nnx').code == 0
  result = run('compare', linen_checkpoint, tmp_path / 'nnx')
  assert result.code == 0, result.stderr
  assert 'params/DotReluDot_1/W2' in result.stdout and 'model/layers/1/w2' in result.stdout
  assert '14 leaves: all identical' in result.stdout

  write_checkpoint(tmp_path / 'other', 'linen', DESC, 'adam', steps=4)  # one more step
  result = run('compare', tmp_path / 'other', tmp_path / 'nnx', '--json')
  assert result.code == 1
  report = json.loads(result.stdout)
  assert not report['identical']
  differing = {r['linen_path'] for r in report['leaves'] if not r['identical']}
  assert 'step' in differing and 'params/DotReluDot_0/W2' in differing
  assert all(r['max_abs_diff'] > 0 for r in report['leaves'] if r['linen_path'] != 'step' and not r['identical'])


def test_compare_description_trains_both_sides_identically():
  # The configuration linen_impl's and nnx_impl's optimizer-state tests compile
  # (test_optimizer_state_is_sharded_as_annotated[fsdp_sgd]): their programs serve.
  result = run('compare', '--layers', '2', '--depth', '64', '--scan', '--steps', '2',
               '--mesh', '4x2', '--annotation', 'logical', '--rules', 'fsdp', '--layer-partition', 'layer',
               '--optimizer', 'fsdp_sgd', '--json')
  assert result.code == 0, result.stderr
  report = json.loads(result.stdout)
  assert report['identical'] and report['losses']['linen'] == report['losses']['nnx']
  assert {r['nnx_path'] for r in report['leaves']} >= {
      'model/layers/dot1/kernel', 'optimizer/momentum/layers/w2', '(optimizer/step)'
  }


# Runs the CLI and stops the process (SIGSTOP) at one point of the conversion,
# so that the test's SIGKILL lands exactly there, never on a finished process.
KILL_DRIVER = """
import os, signal, sys
from linen_nnx_cli import progress
from linen_nnx_cli.main import main
from converters.checkpoint.orbax_files import CheckpointWriter

point = sys.argv[1]

def stop():
  sys.stderr.flush()
  os.kill(os.getpid(), signal.SIGSTOP)

stage = progress.Progress.stage
def stage_then_stop(self, name):
  stage(self, name)
  if name == point:
    stop()
progress.Progress.stage = stage_then_stop

merge = CheckpointWriter.merge
def stop_then_merge(self):
  if point == 'chunks-written':
    stop()
  return merge(self)
CheckpointWriter.merge = stop_then_merge

rename = os.rename
def rename_then_stop(source, destination):
  rename(source, destination)
  if point == 'renamed' and os.path.abspath(destination) == os.path.abspath(sys.argv[4]):  # DST
    stop()
os.rename = rename_then_stop

sys.exit(main(sys.argv[2:]))
"""
# The start of each stage that touches DST; the moment every chunk is written
# into the staging directory but not yet merged nor described; DST just renamed
# into place (complete, the run not yet finished).
KILL_POINTS = ['writing', 'chunks-written', 'verifying', 'renaming', 'renamed']


@pytest.mark.parametrize('point', KILL_POINTS)
def test_sigkill_leaves_src_intact_and_dst_absent_or_complete(linen_checkpoint, tmp_path, point):
  before = tree_checksum(linen_checkpoint)
  dst = tmp_path / 'dst'
  with open(tmp_path / 'stderr', 'w') as log:
    process = subprocess.Popen(
        warm_python.command([sys.executable, '-c', KILL_DRIVER, point, 'convert', str(linen_checkpoint),
                             str(dst), '--to', 'nnx', '--layout', 'scan']),
        stdout=subprocess.DEVNULL, stderr=log,
    )
  try:
    _, status = os.waitpid(process.pid, os.WUNTRACED)  # returns once stopped (or gone)
    assert os.WIFSTOPPED(status), (
        f'the conversion ended before reaching {point!r}: '
        + (tmp_path / 'stderr').read_text()
    )
    process.send_signal(signal.SIGKILL)
  finally:
    if process.poll() is None:
      process.kill()
    process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL
  os.remove(tmp_path / 'stderr')
  assert os.path.exists(dst) == (point == 'renamed')

  assert tree_checksum(linen_checkpoint) == before
  if point == 'renamed':  # complete: restorable and equal to a clean conversion
    trainer, _ = trained_state('nnx', DESC.replace(use_scan=True), 'adam', steps=0)
    clean = tmp_path / 'clean'
    assert run('convert', linen_checkpoint, clean, '--to', 'nnx', '--layout', 'scan').code == 0
    with jax.set_mesh(trainer.mesh):
      assert_bit_identical(nnx_checkpoint.restore(dst, trainer), nnx_checkpoint.restore(clean, trainer))
  else:
    assert checkpoints.inspect(linen_checkpoint).framework == 'linen'
  # A later run for the same DST cleans up and succeeds.
  result = run('convert', linen_checkpoint, dst, '--to', 'nnx', '--layout', 'scan', '--force')
  assert result.code == 0, result.stderr
  assert sorted(os.listdir(tmp_path)) == (['clean', 'dst'] if point == 'renamed' else ['dst'])
