"""Tests of `linen_nnx_cli.side_by_side`: the committed page is what the source says."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from linen_nnx_cli import side_by_side
from linen_nnx_cli.side_by_side import API_MAP, CONCEPTS, ROOT, SOURCES, SideBySideError
from tests.linen_nnx_cli import test_side_by_side_claims


def test_committed_markdown_is_what_the_generator_produces():
  committed = (ROOT / 'docs' / 'side_by_side.md').read_text()
  assert committed == side_by_side.render_markdown(), (
      'docs/side_by_side.md is stale: run '
      'linen-nnx side-by-side --markdown docs/side_by_side.md'
  )


def copy_sources(tmp_path):
  for rel in (rel for part in SOURCES.values() for files in part.values() for rel in files):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / rel, tmp_path / rel)
  return tmp_path


def test_a_concept_marked_on_one_side_only_fails(tmp_path):
  root = copy_sources(tmp_path)
  path = root / 'nnx_impl' / 'checkpoint.py'
  text = path.read_text()
  text = re.sub(r'\n\s*# \[side-by-side: checkpoint\]\n', '\n', text)
  text = re.sub(r'\n\s*# \[/side-by-side\]\n', '\n', text)
  path.write_text(text)
  with pytest.raises(SideBySideError, match="'checkpoint' has no marker in nnx_impl/model.py"):
    side_by_side.collect(root)


def test_unpaired_markers_fail(tmp_path):
  root = copy_sources(tmp_path)
  path = root / 'linen_impl' / 'model.py'
  path.write_text(path.read_text().replace('# [/side-by-side]', '', 1))
  with pytest.raises(SideBySideError, match='opens inside|never closes'):
    side_by_side.collect(root)


def test_every_concept_has_code_on_both_sides():
  concepts = side_by_side.collect()
  assert [c.name for c in CONCEPTS] == list(concepts)
  for name, sides in concepts.items():
    for side, regions in sides.items():
      assert regions and all(r.code.strip() for r in regions), (name, side)
      assert all('side-by-side' not in r.code for r in regions)


def test_html_is_self_contained_two_columns_with_contents_and_highlighting(tmp_path):
  out = tmp_path / 'side.html'
  result = subprocess.run(
      [sys.executable, '-m', 'linen_nnx_cli.main', 'side-by-side', '--html', str(out)],
      capture_output=True, text=True, timeout=120,
  )
  assert result.returncode == 0, result.stderr
  page = out.read_text()
  assert '<script' not in page and '@import' not in page and '@font-face' not in page
  assert not re.search(r'(src|href)="(https?:)?//', page)
  assert page.count('<div class="pair">') == len(CONCEPTS)
  for concept in CONCEPTS:
    assert f'href="#{concept.name}"' in page and f'id="{concept.name}"' in page
    for claim in concept.claims:
      assert side_by_side._inline(claim.text) in page
  # Highlighted by pygments, styled inline: a keyword and the name it defines.
  assert re.search(r'<span style="[^"]+">def</span><span style="[^"]+"> </span><span style="[^"]+">save</span>', page)
  assert 'nnx.Optimizer' in page and 'TrainState' in page


def test_highlight_keeps_the_source_text():
  code = 'def f(x):  # note\n  return "a" + 1\n'
  rendered = side_by_side.highlight(code)
  assert re.sub(r'<[^>]+>', '', rendered).replace('&quot;', '"') == code


def test_a_zoo_concept_marked_on_one_side_only_fails(tmp_path):
  root = copy_sources(tmp_path)
  path = root / 'model_zoo' / 'linen' / 'resnet.py'
  path.write_text(path.read_text().replace('# [side-by-side: batch-norm]', '# [side-by-side: batch-norms]'))
  with pytest.raises(SideBySideError, match="unknown concept 'batch-norms' in zoo.*'batch-norm' has no marker"):
    side_by_side.collect(root)


def test_every_claim_has_its_test_and_every_claims_test_a_claim():
  claims = [c.name for c in side_by_side.claims()]
  assert len(claims) == len(set(claims)), 'claim names repeat'
  tests = {name.removeprefix('test_') for name in dir(test_side_by_side_claims) if name.startswith('test_')}
  assert sorted(set(claims) - tests) == [], 'claims without a test in test_side_by_side_claims'
  assert sorted(tests - set(claims)) == [], 'tests of test_side_by_side_claims that no claim names'


def test_every_api_row_is_backed_by_a_claim():
  claims = {c.name for c in side_by_side.claims()}
  assert [row.linen for row in API_MAP if row.backed_by not in claims] == []


def test_the_page_shows_each_claim_once():
  page = side_by_side.render_markdown()
  for claim in side_by_side.claims():
    assert page.count(claim.text) == 1, claim.name


def test_the_docs_page_lists_its_contents_and_stacks_what_two_columns_cannot_hold():
  # Seen in headless Chromium at 700, 1280 and 1920 px (the note of issue 61):
  # a contents list, code one column below 1800 px, names in the API table unbroken.
  page = side_by_side.render_markdown()
  assert '```{contents} On this page' in page
  css = (ROOT / 'docs' / '_static' / 'custom.css').read_text()
  assert '@media (max-width: 1799.98px)' in css and '.side-by-side > .sd-row > .sd-col { flex: 0 0 100%' in css
  table_rule = re.search(r'\.bd-article:has\(\.side-by-side\) table\.table td code,[^}]*\}', css)
  assert table_rule and 'overflow-wrap: normal' in table_rule[0] and 'anywhere' not in table_rule[0]
  longest = max(len(line) for concept in side_by_side.collect().values() for side in concept.values()
                for region in side for line in region.code.splitlines())
  assert longest <= 110, f'a line of {longest} characters no longer fits one column at 1280 px'
