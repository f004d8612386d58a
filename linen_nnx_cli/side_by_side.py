"""The Linen and NNX implementations paired concept by concept, from the source.

`linen_impl` and `nnx_impl` mark matching regions with

    # [side-by-side: CONCEPT]
    ...
    # [/side-by-side]

(a concept may have several regions in a file; they are shown in order).
`collect` reads them, checks that every concept is marked on both sides, and
`render_markdown` / `render_html` write `docs/side_by_side.md` and a
self-contained two-column HTML page (inline CSS, code highlighted by pygments
with inline styles, no scripts, no remote fonts),
each with a table of contents and a Linen -> NNX API table whose rows link to
where the kit uses both. Nothing here imports JAX.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import pathlib
import re
import textwrap

import pygments
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = {
    'linen': ('linen_impl/model.py', 'linen_impl/train.py', 'linen_impl/checkpoint.py'),
    'nnx': ('nnx_impl/model.py', 'nnx_impl/train.py', 'nnx_impl/sgd.py', 'nnx_impl/checkpoint.py'),
}

#: (marker name, title, what differs), in reading order.
CONCEPTS = (
    ('annotate-params', 'Annotating parameters',
     'Linen wraps the initializer (`nn.with_partitioning`), so `init` returns boxed '
     '`Partitioned` values; NNX keeps the annotation as `out_sharding` metadata on the '
     'Variable (`nnx.with_metadata` for `nnx.Linear`, keyword metadata on `nnx.Param`).'),
    ('logical-names', 'Logical names and rules',
     'Linen boxes are `LogicallyPartitioned` with `rules`; NNX Variables carry '
     '`sharding_rules` metadata, which `nnx.get_partition_spec` applies.'),
    ('activation-constraints', 'Activation constraints',
     'Linen has `nn.with_logical_constraint`; NNX has no logical constraint of its own, '
     "so the kit resolves names with Linen's `nn.logical_to_mesh_axes` and calls "
     '`jax.lax.with_sharding_constraint`.'),
    ('scan-vs-loop', 'Scanned vs looped layers',
     'Linen lifts the module class with `nn.scan(metadata_params=...)`; NNX creates the '
     'stacked layers with `nnx.split_rngs` + `nnx.vmap` and runs them with `nnx.scan`, '
     'both with `transform_metadata`. Loops: Linen auto-names `DotReluDot_i`, NNX needs '
     '`nnx.List`.'),
    ('sharded-creation', 'Sharded creation',
     'Linen traces `init` with `jax.eval_shape`, reads shardings off the boxes '
     '(`nn.get_sharding` or `nn.logical_to_mesh_sharding`) and jits `init` with '
     '`out_shardings`; NNX builds the model inside `nnx.jit` under `jax.set_mesh` and pins '
     'the state with `nnx.get_partition_spec` + `with_sharding_constraint` + `nnx.update`.'),
    ('optimizer-state', 'Optimizer state and its sharding',
     'Linen keeps the optax state in a `TrainState`; its moments are boxed like the '
     'parameters. `nnx.Optimizer(model, tx, wrt=nnx.Param)` copies each parameter\'s '
     'metadata to its moments; the FSDP example\'s SGD does the same by hand.'),
    ('train-step', 'Train step',
     'Linen jits a pure function of the `TrainState`; the kit\'s NNX step is a `jax.jit` '
     'over the bare arrays that merges the model and optimizer back inside the trace, so '
     'no graph traversal happens per call.'),
    ('several-steps', 'Several steps in one call',
     '`jax.lax.scan` over the `TrainState` in Linen; `nnx.scan` with the model and '
     'optimizer as carry in NNX.'),
    ('apply', 'Inference', 'Both jit the forward pass with the output sharded like the batch.'),
    ('checkpoint', 'Checkpoint save and restore',
     'The same Orbax calls; Linen restores into the boxed abstract `TrainState`, NNX into '
     'the abstract state from `nnx.eval_shape`.'),
)

#: (Linen API, NNX API, what to search for in Linen, and in NNX).
API_MAP = (
    ('nn.with_partitioning', 'nnx.with_partitioning / out_sharding', 'nn.with_partitioning', "'out_sharding'"),
    ('nn.with_logical_partitioning', 'nnx.with_metadata(sharding_rules=...)', 'nn.with_logical_partitioning', "'sharding_rules'"),
    ('nn.with_logical_constraint', 'jax.lax.with_sharding_constraint', 'nn.with_logical_constraint', 'jax.lax.with_sharding_constraint(x'),
    ('nn.get_sharding', 'nnx.get_named_sharding', 'nn.get_sharding', 'nnx.get_named_sharding'),
    ('nn.logical_to_mesh_sharding', 'nnx.get_partition_spec with sharding_rules', 'nn.logical_to_mesh_sharding', 'nnx.get_partition_spec'),
    ('nn.scan(metadata_params=...)', 'nnx.vmap / nnx.scan(transform_metadata=...)', 'metadata_params=', 'transform_metadata='),
    ('jax.eval_shape(init)', 'nnx.eval_shape', 'jax.eval_shape', 'nnx.eval_shape'),
    ('TrainState', 'nnx.Optimizer', 'TrainState.create', 'nnx.Optimizer('),
    ('state.apply_gradients', 'optimizer.update', 'apply_gradients', 'optimizer.update'),
    ('jax.value_and_grad', 'nnx.value_and_grad', 'jax.value_and_grad', 'nnx.value_and_grad'),
    ('jax.lax.scan (steps)', 'nnx.scan (steps)', 'jax.lax.scan', '@nnx.scan(in_axes=(nnx.Carry, 0, 0)'),
    ('with mesh: (deprecated)', 'jax.set_mesh', 'jax.set_mesh', 'jax.set_mesh'),
)

# Spans only (the page supplies <pre>), styled inline so the page stays one file.
_LEXER = PythonLexer()
_FORMATTER = HtmlFormatter(nowrap=True, noclasses=True, style='default')

_OPEN = re.compile(r'^\s*# \[side-by-side: ([a-z-]+)\]\s*$')
_CLOSE = re.compile(r'^\s*# \[/side-by-side\]\s*$')


class SideBySideError(ValueError):
  """Markers that do not pair up, or a concept marked on one side only."""


@dataclasses.dataclass(frozen=True)
class Region:
  file: str
  line: int  # first line of code, 1-based
  code: str


def regions(side: str, root: pathlib.Path = ROOT) -> dict[str, list[Region]]:
  """Every marked region of one side, by concept, in file and line order."""
  found: dict[str, list[Region]] = {}
  for rel in SOURCES[side]:
    lines = (root / rel).read_text().splitlines()
    open_at, name = None, None
    for i, line in enumerate(lines):
      if m := _OPEN.match(line):
        if open_at is not None:
          raise SideBySideError(f'{rel}:{i + 1}: {m[1]!r} opens inside {name!r}')
        open_at, name = i, m[1]
      elif _CLOSE.match(line):
        if open_at is None:
          raise SideBySideError(f'{rel}:{i + 1}: a region closes that never opened')
        code = textwrap.dedent('\n'.join(lines[open_at + 1:i])).strip('\n')
        found.setdefault(name, []).append(Region(rel, open_at + 2, code))
        open_at = None
    if open_at is not None:
      raise SideBySideError(f'{rel}:{open_at + 1}: {name!r} never closes')
  return found


def collect(root: pathlib.Path = ROOT) -> dict[str, dict[str, list[Region]]]:
  """`{concept: {'linen': [...], 'nnx': [...]}}`; every concept on both sides."""
  sides = {side: regions(side, root) for side in SOURCES}
  known = {name for name, _, _ in CONCEPTS}
  problems = []
  for side, found in sides.items():
    for name in sorted(set(found) - known):
      problems.append(f'{side} marks unknown concept {name!r}; add it to CONCEPTS')
  for name in sorted(known):
    missing = [side for side in SOURCES if name not in sides[side]]
    if missing:
      problems.append(f'concept {name!r} has no marker in {" or ".join(missing)}_impl')
  if problems:
    raise SideBySideError('; '.join(problems))
  return {name: {side: sides[side][name] for side in SOURCES} for name, _, _ in CONCEPTS}


def _code_lines(path: pathlib.Path) -> list[tuple[int, str]]:
  """`(line number, text)` of the lines that are code: no docstrings, no comments."""
  source = path.read_text()
  docstrings = set()
  for node in ast.walk(ast.parse(source)):
    body = getattr(node, 'body', None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
        getattr(body[0], 'value', None), ast.Constant) and isinstance(body[0].value.value, str):
      docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
  return [
      (i, line) for i, line in enumerate(source.splitlines(), 1)
      if i not in docstrings and not line.lstrip().startswith('#')
  ]


def api_locations(root: pathlib.Path = ROOT) -> list[tuple[str, str, tuple[str, int], tuple[str, int]]]:
  """Each API row with the first place each side uses it."""
  rows = []
  for linen_api, nnx_api, linen_text, nnx_text in API_MAP:
    places = []
    for side, text in (('linen', linen_text), ('nnx', nnx_text)):
      place = next(
          (
              (rel, i)
              for rel in SOURCES[side]
              for i, line in _code_lines(root / rel)
              if text in line
          ),
          None,
      )
      if place is None:
        raise SideBySideError(f'{side}_impl does not use {text!r} ({linen_api} -> {nnx_api})')
      places.append(place)
    rows.append((linen_api, nnx_api, places[0], places[1]))
  return rows


def _where(regions_: list[Region]) -> str:
  return ', '.join(f'`{r.file}:{r.line}`' for r in regions_)


def render_markdown(root: pathlib.Path = ROOT) -> str:
  concepts = collect(root)
  out = [
      '# Linen and NNX, side by side',
      '',
      '<!-- Generated by `linen-nnx side-by-side --markdown docs/side_by_side.md`'
      ' from the markers in linen_impl/ and nnx_impl/. Do not edit. -->',
      '',
      'Each section pairs the code of one concept in `linen_impl` and `nnx_impl`,',
      'taken from the source, with a note on what differs.',
      '',
      '## Contents',
      '',
  ]
  out += [f'- [{title}](#{name})' for name, title, _ in CONCEPTS]
  out += ['- [API mapping, Linen -> NNX](#api-mapping)', '']
  for name, title, note in CONCEPTS:
    out += [f'<a id="{name}"></a>', f'## {title}', '', note, '']
    for side, label in (('linen', 'Linen'), ('nnx', 'NNX')):
      regions_ = concepts[name][side]
      out += [f'**{label}** ({_where(regions_)})', '', '```python']
      out += ['\n\n'.join(r.code for r in regions_), '```', '']
  out += ['<a id="api-mapping"></a>', '## API mapping, Linen -> NNX', '',
          '| Linen | NNX | used in Linen | used in NNX |', '| --- | --- | --- | --- |']
  for linen_api, nnx_api, (lf, ll), (nf, nl) in api_locations(root):
    out.append(
        f'| `{linen_api}` | `{nnx_api}` | [{lf}:{ll}](../{lf}#L{ll}) | [{nf}:{nl}](../{nf}#L{nl}) |'
    )
  return '\n'.join(out) + '\n'


def highlight(code: str) -> str:
  """Python source as HTML spans with inline styles (pygments), for a `<pre>`."""
  return pygments.highlight(code, _LEXER, _FORMATTER)


_CSS = '''
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:110rem;padding:0 1rem;color:#1f2328}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2.5rem;border-bottom:1px solid #d0d7de}
nav ol{columns:2}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
.pair h3{font-size:.95rem;margin:.4rem 0}.where{color:#59636e;font-weight:normal;font-size:.85rem}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.75rem;overflow-x:auto;font:13px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em}
'''


def _inline(text: str) -> str:
  return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(text, quote=False))


def render_html(root: pathlib.Path = ROOT) -> str:
  concepts = collect(root)
  parts = [
      '<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
      '<title>Linen and NNX, side by side</title>', f'<style>{_CSS}</style></head><body>',
      '<h1>Linen and NNX, side by side</h1>',
      '<p>Each section pairs the code of one concept in <code>linen_impl</code> and '
      '<code>nnx_impl</code>, taken from the source, with a note on what differs.</p>',
      '<nav><ol>',
  ]
  parts += [f'<li><a href="#{n}">{html.escape(t)}</a></li>' for n, t, _ in CONCEPTS]
  parts += ['<li><a href="#api-mapping">API mapping, Linen &rarr; NNX</a></li></ol></nav>']
  for name, title, note in CONCEPTS:
    parts += [f'<section id="{name}"><h2>{html.escape(title)}</h2>',
              f'<p>{_inline(note)}</p><div class="pair">']
    for side, label in (('linen', 'Linen'), ('nnx', 'NNX')):
      regions_ = concepts[name][side]
      where = ', '.join(f'{r.file}:{r.line}' for r in regions_)
      code = '\n\n'.join(highlight(r.code) for r in regions_)
      parts.append(
          f'<div><h3>{label} <span class="where">{html.escape(where)}</span></h3>'
          f'<pre><code>{code}</code></pre></div>'
      )
    parts.append('</div></section>')
  parts += ['<section id="api-mapping"><h2>API mapping, Linen &rarr; NNX</h2><table>',
            '<tr><th>Linen</th><th>NNX</th><th>used in Linen</th><th>used in NNX</th></tr>']
  for linen_api, nnx_api, (lf, ll), (nf, nl) in api_locations(root):
    parts.append(
        f'<tr><td><code>{html.escape(linen_api)}</code></td><td><code>{html.escape(nnx_api)}</code></td>'
        f'<td><a href="../{lf}#L{ll}">{lf}:{ll}</a></td><td><a href="../{nf}#L{nl}">{nf}:{nl}</a></td></tr>'
    )
  parts += ['</table></section>', '</body></html>']
  return '\n'.join(parts) + '\n'
