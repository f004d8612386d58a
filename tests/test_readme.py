"""The README's examples run, as users would run them: "Check your own port in CI",
the restore example, and "Convert your checkpoint" with a model of the reader's own."""

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
  # "Port your model in three lines" adds a test to the same file.
  (tmp_path / 'test_my_port.py').write_text(block.group(1) + '\n\n' + _block(readme, 'three-lines'))
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'test_my_port.py'],
      cwd=tmp_path, capture_output=True, text=True, timeout=600,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert '2 passed' in result.stdout


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


def _block(readme: str, name: str) -> str:
  block = re.search(
      rf'<!-- {name}:start -->\n```python\n(.*?)```\n<!-- {name}:end -->', readme, re.S
  )
  assert block, f'the README lost its {name} markers'
  return block.group(1)


def test_convert_your_checkpoint_runs_on_a_model_of_the_readers_own(tmp_path):
  readme = (ROOT / 'README.md').read_text()
  (tmp_path / 'my_models.py').write_text(_block(readme, 'user-models'))
  devices = 'from linen_nnx_cli.devices import simulate_cpu_devices\nsimulate_cpu_devices(8)\n'
  env = {**os.environ, 'PYTHONPATH': str(ROOT)}

  def python(code):
    result = subprocess.run(
        [sys.executable, '-c', devices + code], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr

  python(_block(readme, 'user-training'))
  section = readme[readme.index('## Convert your checkpoint'):readme.index('## Multi-process')]
  models = re.search(r'MODELS="(.*?)"', section, re.S).group(1).replace('\\\n', ' ').split()
  commands = re.findall(r'^(linen-nnx (?:convert|compare) .*?)(?:\s+#.*)?$', section, re.M)
  commands = [c for c in commands if 'weights.msgpack' not in c]  # run below, on the weights
  assert len(commands) == 3  # convert, compare, compare --outputs
  for command in commands:
    args = [models if a == '$MODELS' else [a] for a in command.split()[1:]]
    result = subprocess.run(
        [sys.executable, '-m', 'linen_nnx_cli.main', *sum(args, [])],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr
  python(_block(readme, 'user-restore') + (
      '\nassert int(optimizer.step[...]) == 3\n'
      'assert model.up.kernel[...].shape == (8, 16)\n'
  ))
  # Weights only: saved, converted and loaded as the README shows.
  python(_block(readme, 'user-weights'))
  (command,) = re.findall(r'^(linen-nnx convert weights\.msgpack .*)$', readme, re.M)
  result = subprocess.run(
      [sys.executable, '-m', 'linen_nnx_cli.main', *command.split()[1:]],
      cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
  )
  assert result.returncode == 0, result.stderr
  assert 'weights only: a bare Linen params tree -> NNX parameters' in result.stdout
  python(_block(readme, 'user-weights') + 'saved = params\n' + _block(readme, 'user-weights-restore') + (
      '\nimport numpy as np\n'
      "np.testing.assert_array_equal(model.up.kernel[...], saved['hidden']['kernel'])\n"
      "np.testing.assert_array_equal(model.down.bias[...], saved['out']['bias'])\n"
  ))


def test_port_example_writes_and_proves_the_port(tmp_path):
  readme = (ROOT / 'README.md').read_text()
  block = re.search(
      r'<!-- port-example:start -->\n```python\n(.*?)```\n<!-- port-example:end -->', readme, re.S
  )
  assert block, 'the README lost its port example markers'
  (tmp_path / 'my_models.py').write_text(block.group(1))
  (tmp_path / 'ports').mkdir()
  (command,) = re.findall(r'# (linen-nnx port .*)', block.group(1))
  result = subprocess.run(
      [sys.executable, '-m', 'linen_nnx_cli.main', *command.split()[1:]],
      cwd=tmp_path, capture_output=True, text=True, timeout=600,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  text = (tmp_path / 'ports' / 'models_nnx.py').read_text()
  assert 'self.denses.append(nnx.Linear(in_features, width, rngs=rngs))' in text
  # The written test passes in the user's CI, run from their checkout.
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'ports/test_models_nnx_port.py'],
      cwd=tmp_path, capture_output=True, text=True, timeout=600,
      env={**os.environ, 'PYTHONPATH': str(tmp_path)},
  )
  assert result.returncode == 0, result.stdout + result.stderr
