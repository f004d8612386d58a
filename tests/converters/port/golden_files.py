"""Expected text kept in files beside the tests (`golden/`, `pinned/`):
`assert_same_text` compares what was written with them, and with
`UPDATE_GOLDEN=1` writes them anew first (review their diff before
committing it)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping


def assert_same_text(directory: pathlib.Path, written: Mapping[str, str]) -> None:
  """Each `{file name: text}` of `written` is the text of that file in `directory`."""
  for name, text in written.items():
    if os.environ.get('UPDATE_GOLDEN'):
      (directory / name).write_text(text)
    assert text == (directory / name).read_text(), f'{name} differs: UPDATE_GOLDEN=1 writes it; review the diff'
