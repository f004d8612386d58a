"""The docs site and the README, as readers use them: every code block runs, every
public name is in the reference.

Each page's blocks run in a process and a directory of their own
(`tests/doc_blocks.py` says how); a page that fails names its block by file
and line. The Sphinx build (`make docs`) checks the reference against the
docstrings; the test here checks, without Sphinx, that no public name is left
out of it, so that CI catches one before a docs build does.
"""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from linen_nnx_cli.options import UsageError
from tests import warm_python
from tests.doc_blocks import ROOT, Block, PageError, blocks

sys.path.insert(0, str(ROOT / 'docs' / '_ext'))
import public_api  # noqa: E402 (docs/_ext is not a package)

# Pages whose code blocks are excerpts of the kit's own source, which its own
# tests run; the named test checks that the page is the source as it is.
EXCERPTS = {'docs/side_by_side.md': 'tests/linen_nnx_cli/test_side_by_side.py'}
PAGES = sorted(
    path.relative_to(ROOT).as_posix()
    for path in [ROOT / 'README.md', *(ROOT / 'docs').rglob('*.md')]
    if '_build' not in path.parts
)
RUN_PAGES = [
    page for page in PAGES
    if page not in EXCERPTS and any(b.runs or b.file for b in blocks(ROOT / page))
]
# Pages whose run takes over 15 s in CI (a port proven, checkpoints written and
# converted by several `linen-nnx` processes): `make nightly` runs them; CI
# checks that what they show still parses (`test_what_the_nightly_pages_show_
# is_code_and_commands_the_kit_accepts`), and the tests of the commands and
# functions they call run in CI.
NIGHTLY_PAGES = {
    'docs/guides/convert_a_checkpoint.md',
    'docs/guides/generate_a_port.md',
    'docs/guides/large_checkpoints.md',
    'docs/guides/prove_a_port.md',
}


# Pages whose runnable blocks are another page's, letter for letter
# (`test_pages_that_run_the_same_code_hold_the_same_code`): CI runs the other.
SAME_CODE = {'README.md': 'docs/getting_started.md'}


def _env() -> dict:
  """A page's process's environment: the kit importable from the checkout."""
  return {**os.environ, 'PYTHONPATH': str(ROOT)}


@pytest.mark.parametrize('page', [
    pytest.param(page, marks=pytest.mark.nightly) if page in NIGHTLY_PAGES or page in SAME_CODE else page
    for page in RUN_PAGES
])
def test_page_runs(page, tmp_path):
  env = _env()
  result = subprocess.run(
      warm_python.command([sys.executable, '-m', 'tests.doc_blocks', str(ROOT / page)], env),
      cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env,
  )
  assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def test_pages_that_run_the_same_code_hold_the_same_code():
  def runnable(page):
    return [(b.language, b.code, b.file) for b in blocks(ROOT / page) if b.runs or b.file]
  for page, same in SAME_CODE.items():
    assert runnable(page) and runnable(page) == runnable(same), f'{page} no longer runs what {same} runs'


_OPERATORS = {'&&', '||', ';', '|', '&'}
_PREFIXES = {'time', '!', 'if', 'then', 'else', 'elif', 'do', 'while', 'until'}
_REDIRECTIONS = {'>', '>>', '<', '2>', '&>', '>&'}
_KIT = (['linen-nnx'], ['python', '-m', 'linen_nnx_cli.main'])


def _segments(line: str) -> list[list[str]]:
  """`line`'s simple commands, each its words as bash splits them (quotes
  removed, comments dropped), cut at `&&`, `||`, `;`, `&` and pipes."""
  lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  segments = [[]]
  for word in lexer:
    if word in _OPERATORS:
      segments.append([])
    else:
      segments[-1].append(word)
  return segments


def _expanded(word: str, names: dict[str, str], where: str) -> list[str]:
  """`$NAME` or `${NAME}` as the words of the block's own assignment."""
  if variable := re.fullmatch(r'\$\{?(\w+)\}?', word):
    assert variable.group(1) in names, f'{where}: ${variable.group(1)} is set outside the block'
    return names[variable.group(1)].split()
  assert '$' not in word, f'{where}: {word!r}: write the variable as a word of its own'
  return [word]


def _lines(block: Block) -> list[str]:
  """The block's lines, joined where one ends in a backslash."""
  return block.code.replace('\\\n', ' ').split('\n')


def _commands(block: Block) -> list[list[str]]:
  """The arguments of each `linen-nnx` (or `python -m linen_nnx_cli.main`)
  command of an sh block: lines joined at a trailing backslash, each cut at
  `&&`, `||`, `;` and pipes, a redirection ending the arguments, `NAME=value`
  read for the commands after it, `time`, `!`, `if`, ... skipped."""
  names, found = {}, []
  for line in _lines(block):
    for segment in _segments(line):
      words = []
      for word in segment:
        if not words and word in _PREFIXES:
          continue
        if not words and (assignment := re.fullmatch(r'(\w+)=(.*)', word, re.DOTALL)):
          names[assignment.group(1)] = assignment.group(2)
          continue
        words.extend(_expanded(word, names, block.where))
      for kit in _KIT:
        if words[:len(kit)] == kit:
          arguments = words[len(kit):]
          ends = [k for k, word in enumerate(arguments) if word in _REDIRECTIONS]
          found.append(arguments[:ends[0]] if ends else arguments)
  return found


def _mentions(block: Block) -> int:
  """How many times the block's code names the command (comments aside)."""
  return sum(
      word in ('linen-nnx', 'linen_nnx_cli.main')
      for line in _lines(block) for segment in _segments(line) for word in segment
  )


def test_what_the_nightly_pages_show_is_code_and_commands_the_kit_accepts():
  from linen_nnx_cli.main import build_parser

  assert NIGHTLY_PAGES <= set(RUN_PAGES)
  commands = 0
  for page in sorted(NIGHTLY_PAGES):
    for block in blocks(ROOT / page):
      if block.language == 'python' and (block.runs or block.file):
        compile(block.code, block.where, 'exec')
      elif block.language == 'sh' and block.runs:
        found = _commands(block)
        assert len(found) == _mentions(block), f'{block.where}: a command the test cannot read'
        for argv in found:
          try:
            build_parser().parse_args(argv)
          except UsageError as e:
            pytest.fail(f'{block.where}: linen-nnx {shlex.join(argv)}: {e}')
          commands += 1
  assert commands >= 9  # the pages' commands were found


def test_a_command_a_page_shows_is_split_as_bash_splits_it(tmp_path):
  page = _page(tmp_path, (
      '```sh\nFLAGS="--to nnx \\\n   --json"\n'
      'linen-nnx convert a b $FLAGS  # a comment\nmkdir -p out\n'
      'linen-nnx port m:f \\\n  --out "out/my models.py"\n```\n'))
  (block,) = blocks(page)
  assert _commands(block) == [
      ['convert', 'a', 'b', '--to', 'nnx', '--json'], ['port', 'm:f', '--out', 'out/my models.py']]
  (block,) = blocks(_page(tmp_path, (
      '```sh\ncd out && time linen-nnx map --json > map.json; D=x; linen-nnx compare a ${D} | head\n'
      'if python -m linen_nnx_cli.main side-by-side; then echo ok; fi\n```\n')))
  assert _commands(block) == [['map', '--json'], ['compare', 'a', 'x'], ['side-by-side']]
  assert _mentions(block) == 3
  (block,) = blocks(_page(tmp_path, '```sh\nxargs linen-nnx convert < args\n```\n'))
  assert _commands(block) == [] and _mentions(block) == 1  # refused by the page test: unread
  from linen_nnx_cli.main import build_parser

  with pytest.raises(UsageError, match='--too'):
    build_parser().parse_args(['convert', 'a', 'b', '--to', 'nnx', '--too'])


def test_every_page_parses_into_blocks_the_runner_runs_or_that_name_what_runs_them():
  # `blocks` refuses (PageError) what a page's runner could not see or run.
  for page in PAGES:
    blocks(ROOT / page)
  assert all((ROOT / test).exists() for test in EXCERPTS.values())


def test_reference_documents_every_public_name():
  directive = re.compile(r'^\.\. auto\w+:: (\S+)', re.M)
  documented = {
      name: public_api.resolve(name)
      for path in (ROOT / 'docs' / 'reference').glob('*.md')
      for name in directive.findall(path.read_text())
  }
  missing = [
      name for name, obj in public_api.public_names().items()
      if public_api.covered(name, obj, documented) is None
  ]
  assert missing == [], f'add these to a page of docs/reference/: {missing}'
  undocumented = [
      name for name, obj in public_api.public_names().items()
      if callable(obj) and not inspect.getdoc(obj)
  ]
  assert undocumented == [], f'write a docstring for: {undocumented}'


# The runner itself: a page that fails, fails, and a block left out must say what runs it.

def _page(tmp_path, text):
  path = tmp_path / 'page.md'
  path.write_text(text)
  return path


def test_a_failing_block_fails_naming_its_line(tmp_path):
  page = _page(tmp_path, '# A page\n\n```python\nx = 1\n```\n\n```python\nassert x == 2\n```\n')
  result = subprocess.run(
      [sys.executable, '-m', 'tests.doc_blocks', str(page)], cwd=tmp_path,
      capture_output=True, text=True, timeout=300, env=_env(),
  )
  assert result.returncode != 0
  assert 'page.md:7: the python block failed' in result.stderr


def test_blocks_share_a_namespace_files_are_written_and_sh_runs(tmp_path):
  page = _page(tmp_path, (
      '```{code-block} python\n:caption: helper.py\n\nVALUE = 3\n```\n\n'
      '```python\nimport helper\nx = helper.VALUE\n```\n\n'
      '```sh\ntest "$(python -c \'import helper; print(helper.VALUE)\')" = 3\n```\n\n'
      '```python\nassert x == 3\n```\n\n'
      '```sh\nfalse\n```\n'
  ))
  work = tmp_path / 'work'
  work.mkdir()
  result = subprocess.run(
      [sys.executable, '-m', 'tests.doc_blocks', str(page)], cwd=work,
      capture_output=True, text=True, timeout=300, env=_env(),
  )
  assert (work / 'helper.py').read_text() == 'VALUE = 3\n'
  assert 'page.md:20: the sh block exited 1' in result.stderr, result.stdout + result.stderr


def test_a_block_left_out_must_name_an_existing_test(tmp_path):
  with pytest.raises(PageError, match='names nothing that runs it'):
    blocks(_page(tmp_path, '<!-- not run: too slow -->\n```python\nx = 1\n```\n'))
  with pytest.raises(PageError, match='tests/no_such_test.py, which does not exist'):
    blocks(_page(tmp_path, '<!-- not run: tests/no_such_test.py -->\n```python\nx = 1\n```\n'))
  (block,) = blocks(_page(tmp_path, '<!-- not run: tests/test_docs.py -->\n```python\nx = 1\n```\n'))
  assert not block.runs
  with pytest.raises(PageError, match='inside the page'):
    blocks(_page(tmp_path, '```{code-block} python\n:caption: ../evil.py\n\nx = 1\n```\n'))
  # The comment is for the block right after it only.
  _, second = blocks(_page(
      tmp_path, '<!-- not run: tests/test_docs.py -->\n```python\nx = 1\n```\n\ntext\n\n```python\ny = 2\n```\n'))
  assert second.runs


def test_the_benchmarks_page_names_every_benchmark_make_runs():
  # The block of docs/benchmarks.md that is not run: what `make benchmark` runs.
  (block,) = [b for b in blocks(ROOT / 'docs' / 'benchmarks.md') if b.language == 'sh']
  named = re.findall(r'benchmarks/\w+\.py', block.code)
  makefile = (ROOT / 'Makefile').read_text()
  target = makefile[makefile.index('\nbenchmark:'):].split('\n\n')[0]
  scripts = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / 'benchmarks').glob('*.py'))
  assert sorted(named) == sorted(re.findall(r'benchmarks/\w+\.py', target)) == scripts


def test_code_the_runner_cannot_see_is_refused_and_nested_code_is_found(tmp_path):
  for text, message in (
      ('text\n\n    x = 1\n', 'indented code block'),
      (':::{code-block} python\nx = 1\n:::\n', 'colon-fenced code directive'),
      ('```{code-cell} python\nx = 1\n```\n', 'write code as'),
      ('```{eval-rst}\n.. code-block:: python\n\n   x = 1\n```\n', 'code inside'),
      ('```py\nx = 1\n```\n', 'a block in py'),
      ('```\nx = 1\n```\n', 'a block in no language'),
  ):
    with pytest.raises(PageError, match=message):
      blocks(_page(tmp_path, text))
  (nested,) = blocks(_page(tmp_path, '````{note}\nRead this.\n\n```python\nx = 1\n```\n````\n'))
  assert (nested.language, nested.code, nested.line) == ('python', 'x = 1\n', 4)


def test_the_site_builds_with_no_warning_and_no_broken_link(tmp_path):
  # What `make docs` runs: every warning is an error, and the build checks the
  # reference against the public names and the built site's links. (Started
  # warm, in the pages' environment, whose server has imported JAX and Flax for
  # autodoc; the path it adds is the one conf.py puts first anyway.)
  env = _env()
  result = subprocess.run(
      warm_python.command([sys.executable, '-m', 'sphinx', '-E', '-W', '--keep-going', '-q', '-b', 'html',
                           str(ROOT / 'docs'), str(tmp_path / 'html')], env),
      capture_output=True, text=True, timeout=900, env=env,
  )
  assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
  assert (tmp_path / 'html' / 'side_by_side.html').is_file()


# The build's own checks (docs/_ext), on hostile input.

def test_links_that_lead_nowhere_or_out_of_the_site_are_broken(tmp_path):
  import offline_links

  (tmp_path / 'sub').mkdir()
  (tmp_path / 'index.html').write_text(
      '<p id="top"></p><a href="sub/page.html#here">ok</a><a href="#top">ok</a>'
      '<a href="sub/page%20two.html">ok, quoted</a><a href="https://flax.readthedocs.io">not followed</a>'
      '<a href="sub/page.html#gone">no anchor</a><a href="missing.html">no file</a>'
      '<a href="/etc/hostname">absolute</a><a href="../../etc/hostname">outside</a>'
      '<a href="file:///etc/hostname">file</a><img srcset="pic.png 1x, sub/pic.png 2x">')
  (tmp_path / 'sub' / 'page.html').write_text('<h1 id="here">here</h1>')
  (tmp_path / 'sub' / 'page two.html').write_text('<p>two</p>')
  (tmp_path / 'sub' / 'pic.png').write_bytes(b'')
  broken = offline_links.broken_links(tmp_path)
  assert broken == [
      'index.html: sub/page.html#gone (no #gone on sub/page.html)',
      'index.html: missing.html (no such file)',
      'index.html: /etc/hostname (not a link within the site)',
      'index.html: ../../etc/hostname (outside the site)',
      'index.html: file:///etc/hostname (not a link within the site)',
      'index.html: pic.png (no such file)',
  ]
  assert offline_links.external_links(tmp_path) == ['https://flax.readthedocs.io']


def test_the_same_object_under_another_name_does_not_cover_a_public_name():
  from converters import presets

  documented = {'converters.presets.KIT_PATHS': presets.KIT_PATHS}
  assert presets.GUIDE_PATHS is presets.KIT_PATHS
  assert public_api.covered('converters.KIT_PATHS', presets.KIT_PATHS, documented) == (
      'converters.presets.KIT_PATHS')
  assert public_api.covered('converters.GUIDE_PATHS', presets.GUIDE_PATHS, documented) is None


def test_the_command_reference_has_every_command_with_each_option_as_typed():
  import cli_reference

  from linen_nnx_cli.main import COMMANDS

  parsers = cli_reference.commands()
  assert sorted(parsers) == sorted(COMMANDS)
  (mesh,) = [a for a in parsers['convert']._actions if '--mesh' in a.option_strings]
  assert 'Default: 2x4.' in cli_reference._help(mesh)


def test_what_runs_a_block_left_out_must_name_its_page(tmp_path, monkeypatch):
  import tests.doc_blocks as doc_blocks

  monkeypatch.setattr(doc_blocks, 'ROOT', tmp_path)
  (tmp_path / 'tests').mkdir()
  (tmp_path / 'tests' / 'test_x.py').write_text('"""Runs what nothing shows."""\n')
  page = _page(tmp_path, '<!-- not run: tests/test_x.py -->\n```python\nx = 1\n```\n')
  with pytest.raises(PageError, match='which does not name page.md'):
    doc_blocks.blocks(page)
  (tmp_path / 'tests' / 'test_x.py').write_text('"""Runs what page.md shows."""\n')
  (block,) = doc_blocks.blocks(page)
  assert block.not_run == 'tests/test_x.py'


def test_the_readme_links_to_files_that_exist():
  # The README is read on its own (outside the site's build and its link check).
  links = re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', (ROOT / 'README.md').read_text())
  assert links, 'the README links to the docs'
  assert [link for link in links if '://' not in link and not (ROOT / link).exists()] == []
