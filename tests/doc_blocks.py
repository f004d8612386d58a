"""The code blocks of a Markdown page, and a runner that runs them as a reader would.

A page's blocks run in page order in one process, in an empty directory of
their own (8 simulated CPU devices), as a notebook runs:

- a `python` block is executed, every block of the page in one namespace;
- a python `{code-block}` whose `:caption:` is a file name (`my_models.py`)
  is written to that file, for the blocks after it to import or run;
- an `sh` block runs in bash (`-euo pipefail`), with this interpreter's
  `linen-nnx`, `python` and `pytest` first on the PATH;
- a block right after `<!-- not run: REASON -->` is left out; REASON names
  the test or script that runs what it shows (`tests/...py`, `.ci/run`),
  which must exist and name the page back.

Blocks inside MyST directives (admonitions, grid items) are the page's
blocks too; blocks in `text` are not code. What the runner could not see is
refused (`PageError`): indented code, colon-fenced or other code directives,
code inside `{eval-rst}`, a block in another language (`py`, `bash`) or
none. Run a page with
`python -m tests.doc_blocks PAGE.md` from an empty directory.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOT_RUN = re.compile(r'<!--\s*not run:\s*(.*?)\s*-->', re.S)
RUNS_IT = re.compile(r'(?:tests/[\w/]+\.py|\.ci/run)')


class PageError(ValueError):
  """A page whose blocks cannot be run as written (names the page and line)."""


@dataclasses.dataclass(frozen=True)
class Block:
  """One fenced block: its language, where it starts, and what to do with it."""

  page: str
  line: int  # 1-based, the fence's own line
  language: str
  code: str
  file: str | None = None  # write the code to this file instead of running it
  not_run: str | None = None  # why it is left out, naming what runs it

  @property
  def where(self) -> str:
    return f'{self.page}:{self.line}'

  @property
  def runs(self) -> bool:
    return self.not_run is None and self.language in ('python', 'sh')


def blocks(path: pathlib.Path) -> list[Block]:
  """Every fenced block of the page at `path`, in page order, those inside
  MyST directives (admonitions, grid items) included.

  Raises `PageError` for code the runner cannot see: an indented code block,
  a colon-fenced code directive, a code directive other than `{code-block}`,
  code inside `{eval-rst}`, a caption that writes outside the page's directory.
  """
  page = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
  text = path.read_text()
  for number, line in enumerate(text.split('\n'), 1):
    if re.match(r'\s*:{3,}\s*\{(code|code-block|code-cell|literalinclude)\}', line):
      raise PageError(f'{page}:{number}: a colon-fenced code directive: write it with backticks (```{{code-block}} python)')
  return _blocks(text, page, 0)


def _blocks(text: str, page: str, offset: int) -> list[Block]:
  from markdown_it import MarkdownIt

  found, reason = [], None
  for token in MarkdownIt('commonmark').parse(text):
    line = offset + token.map[0] + 1 if token.map else offset
    if token.type == 'code_block':
      raise PageError(f'{page}:{line}: an indented code block: fence it (```python, ```sh or ```text)')
    if token.type == 'html_block' and NOT_RUN.search(token.content):
      reason = NOT_RUN.search(token.content).group(1)
      continue
    if token.type != 'fence':
      reason = None  # a "not run" comment is for the block right after it
      continue
    info = token.info.split()
    language, code, file = (info[0] if info else ''), token.content, None
    if language.startswith('{') and language != '{code-block}':
      _directive(language, code, page, line, found)
      reason = None
      continue
    if language == '{code-block}':
      language = info[1] if len(info) > 1 else ''
      options, code = _directive_options(code)
      caption = options.pop('caption', None)
      if options:
        raise PageError(f'{page}:{line}: code-block options {sorted(options)}: only :caption: is read')
      if caption and caption.endswith('.py'):
        parts = pathlib.PurePosixPath(caption).parts
        if caption.startswith('/') or '..' in parts or not all(re.fullmatch(r'[\w.-]+', p) for p in parts):
          raise PageError(f'{page}:{line}: caption {caption!r}: name a file inside the page\'s directory')
        file = caption
    if language not in LANGUAGES:
      raise PageError(
          f'{page}:{line}: a block in {language or "no language"}: say python or sh (run) '
          'or text (not code)')
    if reason is not None and not RUNS_IT.search(reason):
      raise PageError(
          f'{page}:{line}: "not run: {reason}" names nothing that runs it: name the '
          'test (tests/...py) or script (.ci/run) that does')
    for named in RUNS_IT.findall(reason or ''):
      if not (ROOT / named).exists():
        raise PageError(f'{page}:{line}: "not run" names {named}, which does not exist')
      if not pathlib.Path(page).is_absolute() and page not in (ROOT / named).read_text():
        raise PageError(
            f'{page}:{line}: "not run" names {named}, which does not name {page}: say there '
            'that it runs what the page shows, so that a change to either is seen from the other')
    found.append(Block(page, line, language, code, file, reason))
    reason = None
  return found


LANGUAGES = ('python', 'sh', 'text')
# Directives of the site that hold no code, and those whose content is Markdown.
WITHOUT_CODE = ('{toctree}', '{linen-nnx-command}', '{eval-rst}')


def _directive(name: str, content: str, page: str, line: int, found: list[Block]) -> None:
  if name == '{eval-rst}':
    if re.search(r'^\s*\.\. (code|code-block|sourcecode|literalinclude)::', content, re.M):
      raise PageError(f'{page}:{line}: code inside {{eval-rst}}: write it as a Markdown block')
  elif name in WITHOUT_CODE:
    return
  elif re.fullmatch(r'\{(code|code-cell|sourcecode|literalinclude|jupyter-execute)[\w-]*\}', name):
    raise PageError(f'{page}:{line}: {name}: write code as ```python, ```sh or ```{{code-block}} python')
  else:  # an admonition, a grid item: Markdown, its blocks are the page's
    options, body = _directive_options(content)
    skipped = content.count('\n') - body.count('\n')
    found.extend(_blocks(body, page, line + skipped))


def _directive_options(code: str) -> tuple[dict[str, str], str]:
  options, lines = {}, code.split('\n')
  while lines and (match := re.fullmatch(r':(\w+):\s*(.*)', lines[0])):
    options[match.group(1)] = match.group(2)
    lines.pop(0)
  if options and lines and not lines[0].strip():
    lines.pop(0)
  return options, '\n'.join(lines)


def run(path: pathlib.Path) -> None:
  """Runs the page's blocks here, in page order; exits non-zero at the first failing one."""
  from linen_nnx_cli.devices import simulate_cpu_devices

  simulate_cpu_devices(8)
  here = pathlib.Path.cwd()
  sys.path.insert(0, str(here))
  env = {**os.environ, 'PATH': os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH']}
  namespace = {'__name__': '__main__'}
  for block in blocks(path):
    if block.not_run is not None or not (block.runs or block.file):
      continue
    if block.file is not None:
      (here / block.file).parent.mkdir(parents=True, exist_ok=True)
      (here / block.file).write_text(block.code)
    elif block.language == 'sh':
      print(f'--- {block.where} (sh)', flush=True)
      result = subprocess.run(['bash', '-euo', 'pipefail', '-c', block.code], cwd=here, env=env)
      if result.returncode:
        sys.exit(f'{block.where}: the sh block exited {result.returncode}')
    else:
      print(f'--- {block.where} (python)', flush=True)
      try:
        exec(compile(block.code, block.where, 'exec'), namespace)
      except BaseException:  # noqa: BLE001 (reported with the block's place, then fail)
        traceback.print_exc()
        sys.exit(f'{block.where}: the python block failed')


if __name__ == '__main__':
  run(pathlib.Path(sys.argv[1]).resolve())
