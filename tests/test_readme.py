"""The README's "Check your own port in CI" example runs, as users would run it."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

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
