"""`linen-nnx` run in the test process, for tests that run it many times.

`run` calls `linen_nnx_cli.main.main` with stdout and stderr captured, which
saves a Python and JAX start-up per call; tests that need a fresh process (the
device count, a SIGKILL, output printed at exit) run the command as a
subprocess instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from typing import Any

from linen_nnx_cli import main as cli


@dataclasses.dataclass(frozen=True)
class Run:
  code: int
  stdout: str
  stderr: str

  @property
  def json(self) -> Any:
    return json.loads(self.stdout)

  @property
  def reason(self) -> str:
    """The one line that says why a run failed: the last line on stderr."""
    return self.stderr.strip().splitlines()[-1]


def run(*args: str | os.PathLike) -> Run:
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main([os.fspath(a) for a in args])
  return Run(code, out.getvalue(), err.getvalue())


def assert_refused(result: Run, *fragments: str) -> None:
  """Exit 2, one line naming the problem on stderr, the JSON object on stdout."""
  assert result.code == 2, (result.code, result.stderr)
  assert result.reason.startswith('linen-nnx'), result.stderr
  for fragment in fragments:
    assert fragment in result.reason, (fragment, result.reason)
  if result.stdout:
    assert result.json == {'ok': False, 'exit_code': 2, 'error': result.reason.split(': ', 1)[1]}
