"""Sphinx configuration of the linen-nnx-kit docs: `make docs` builds them offline.

Sphinx with MyST Markdown and the book theme, as Flax and Optax build theirs:
the reference is generated from the docstrings (autodoc, Google style read
by napoleon) and the command line's reference from its argparse parser. The
build fails on any warning, on a public name the reference leaves out
(`public_api`) and on a link that leads nowhere (`offline_links`).
"""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '_ext'))

# The command line's reference imports it: simulated devices before JAX starts.
from linen_nnx_cli.devices import simulate_cpu_devices  # noqa: E402

simulate_cpu_devices(8)

project = 'linen-nnx-kit'
author = 'linen-nnx-kit contributors'
copyright = '2026, linen-nnx-kit contributors'  # noqa: A001 (Sphinx's name)

extensions = [
    'myst_parser',
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'sphinx_design',
    'cli_reference',
    'public_api',
    'offline_links',
]

root_doc = 'index'
source_suffix = {'.md': 'markdown'}
exclude_patterns = ['_build', 'README.md']
# Backticks in docstrings are code, as in Markdown.
default_role = 'code'

myst_enable_extensions = ['colon_fence', 'deflist']
myst_heading_anchors = 3

autodoc_default_options = {'member-order': 'bysource'}
autodoc_typehints = 'description'
autodoc_typehints_format = 'short'
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = 'sphinx_book_theme'
html_title = 'linen-nnx-kit'
html_static_path = ['_static']
html_css_files = ['custom.css']
html_favicon = '_static/favicon.svg'
html_theme_options = {
    'show_toc_level': 2,
    'navigation_with_keys': False,
    'use_download_button': False,
    'use_fullscreen_button': False,
}
# Options and code read literally: no typographic dashes or quotes.
smartquotes = False

# Docstrings write code as Markdown does: a word may follow the closing
# backtick (`PathRule`s), which reStructuredText reads only when escaped.
_CODE_THEN_WORD = re.compile(r'(`[^`\s][^`]*`)(?=\w)')


def _markdown_backticks(app, what, name, obj, options, lines):
  lines[:] = [_CODE_THEN_WORD.sub(r'\1\\ ', line) for line in lines]


def setup(app):
  app.connect('autodoc-process-docstring', _markdown_backticks)
