"""No link of the built site leads nowhere: checked offline, after the HTML is written.

Every relative `href`, `src` and `srcset` of every page must name a file of
the site (never an absolute path, a `file:` URL or a path out of the site),
and its `#fragment` an `id` on that page. Links to other sites (http, https,
mailto) are not followed (the build runs offline); `external_links(outdir)`
lists them.
"""

from __future__ import annotations

import html.parser
import pathlib
import posixpath
import urllib.parse
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import SphinxError


class _Page(html.parser.HTMLParser):
  """The ids a page defines and the links it makes."""

  def __init__(self):
    super().__init__()
    self.ids: set[str] = set()
    self.links: list[str] = []

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    for key in ('id', 'name') if tag == 'a' else ('id',):
      if attrs.get(key):
        self.ids.add(attrs[key])
    for key in ('href', 'src'):
      if attrs.get(key) is not None:
        self.links.append(attrs[key])
    for candidate in (attrs.get('srcset') or '').split(','):
      if candidate.strip():
        self.links.append(candidate.split()[0])


def _pages(outdir: pathlib.Path) -> dict[str, _Page]:
  pages = {}
  for path in sorted(outdir.rglob('*.html')):
    if path.relative_to(outdir).parts[0] in ('_static', '_sources'):
      continue  # the theme's templates and the page sources, not pages
    page = _Page()
    page.feed(path.read_text(encoding='utf-8'))
    pages[path.relative_to(outdir).as_posix()] = page
  return pages


def broken_links(outdir: pathlib.Path) -> list[str]:
  """`'page: link (why)'` for every relative link of the site that leads nowhere."""
  pages = _pages(outdir)
  broken = []
  for name, page in pages.items():
    for link in page.links:
      parts = urllib.parse.urlsplit(link)
      if parts.scheme in ('http', 'https', 'mailto') or link.startswith(('javascript:', 'data:')):
        continue
      if parts.scheme or parts.netloc or parts.path.startswith('/'):
        broken.append(f'{name}: {link} (not a link within the site)')
        continue
      fragment = urllib.parse.unquote(parts.fragment)
      if parts.path:
        target = posixpath.normpath(
            posixpath.join(posixpath.dirname(name), urllib.parse.unquote(parts.path)))
        if target.startswith('../') or target == '..':
          broken.append(f'{name}: {link} (outside the site)')
          continue
        if target.endswith('/') or (outdir / target).is_dir():
          target = posixpath.join(target, 'index.html')
        if not (outdir / target).is_file():
          broken.append(f'{name}: {link} (no such file)')
          continue
      else:
        target = name
      if fragment and target in pages and fragment not in pages[target].ids:
        broken.append(f'{name}: {link} (no #{fragment} on {target})')
  return broken


def external_links(outdir: pathlib.Path) -> list[str]:
  """Every link of the site to another site, once each."""
  return sorted({
      link for page in _pages(outdir).values() for link in page.links
      if urllib.parse.urlsplit(link).scheme in ('http', 'https')
  })


def _check(app: Sphinx, exception) -> None:
  if exception is not None or app.builder.format != 'html':
    return
  broken = broken_links(pathlib.Path(app.outdir))
  if broken:
    raise SphinxError(f'{len(broken)} links lead nowhere:\n  ' + '\n  '.join(broken))


def setup(app: Sphinx) -> dict[str, Any]:
  app.connect('build-finished', _check)
  return {'version': '1', 'parallel_read_safe': True}
