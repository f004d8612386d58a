"""The planted bugs (`tests/planted_bugs.py`) still apply to the code as it is.

Planting them all takes minutes, so `make test` does not; but a bug whose line
the code no longer has plants nothing, and would go unnoticed until someone
runs them. Each line must occur exactly once in its file.
"""

from __future__ import annotations

import pytest

from tests.planted_bugs import BUGS, ROOT


@pytest.mark.parametrize('number', sorted(BUGS))
def test_each_planted_bug_finds_its_line_exactly_once(number):
  bug = BUGS[number]
  count = (ROOT / bug.file).read_text().count(bug.line)
  assert count == 1, (
      f'bug {number} ({bug.what}): {bug.line!r} occurs {count} times in {bug.file}; '
      'rewrite it against the current code and check it is caught '
      f'(python -m tests.planted_bugs {number})'
  )
