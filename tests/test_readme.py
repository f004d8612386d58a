"""The README's "Check your own port in CI" example runs, as users would run it."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np

from tests.converters.checkpoint.fixtures import assert_same_values_by_layer, flat

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ci_example_passes_under_pytest(tmp_path):
  readme = (ROOT / 'README.md').read_text()
  block = re.search(
      r'<!-- ci-example:start -->\n```python\n(.*?)```\n<!-- ci-example:end -->', readme, re.S
  )
  assert block, 'the README lost its CI example markers'
  (tmp_path / 'test_my_port.py').write_text(block.group(1))
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'test_my_port.py'],
      cwd=tmp_path, capture_output=True, text=True, timeout=600,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert '1 passed' in result.stdout


def test_restore_example_reads_converted_checkpoints(tmp_path):
  from tests.converters.checkpoint.fixtures import DESC, write_checkpoint

  readme = (ROOT / 'README.md').read_text()
  block = re.search(
      r'<!-- restore-example:start -->\n```python\n(.*?)```\n<!-- restore-example:end -->',
      readme, re.S,
  )
  assert block, 'the README lost its restore example markers'
  _, state = write_checkpoint(tmp_path / 'linen_ckpt', 'linen', DESC, 'adam', steps=2)
  # The conversions the example's comments show, as users run them.
  for command in re.findall(r'# (linen-nnx convert .*)', block.group(1)):
    args = command.split()[1:]
    result = subprocess.run(
        [sys.executable, '-m', 'linen_nnx_cli.main', *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
  script = (
      'from linen_nnx_cli.devices import simulate_cpu_devices\n'
      'simulate_cpu_devices(8)\n' + block.group(1) + '\n'
      'import numpy as np\n'
      'from tests.converters.checkpoint.fixtures import flat\n'
      'for name, tree in (("nnx", nnx.state({"model": model, "optimizer": optimizer})),\n'
      '                   ("linen", train_state)):\n'
      '  np.savez(f"{name}.npz", **{p: np.asarray(x) for p, x in flat(tree)})\n'
  )
  result = subprocess.run(
      [sys.executable, '-c', script], cwd=tmp_path, capture_output=True, text=True,
      timeout=600, env={**os.environ, 'PYTHONPATH': str(ROOT)},
  )
  assert result.returncode == 0, result.stderr
  # Every parameter, moment and counter the example restored, on both sides,
  # holds the value of the trained state that was written.
  for name in ('nnx', 'linen'):
    with np.load(tmp_path / f'{name}.npz') as restored:
      assert_same_values_by_layer(flat(state), restored.items())
