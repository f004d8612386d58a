"""`linen-nnx port pkg.mod:factory --out models_nnx.py`: write the NNX port
of a Linen model and prove it (`converters.port`); with `--side-by-side
port.html`, a page pairing each Linen class with its port
(`linen_nnx_cli.side_by_side.render_port_html`).

Exit status: 0 when the port is written and proven; 1 when it is written
with stubs (classes to port by hand, each named), or its proof or ruff check
failed; 2 when nothing is written (a factory that fails, an output inside
the package being read or existing without `--force`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

from linen_nnx_cli.failures import fail
from linen_nnx_cli.runtime import Needs

NAME = 'port'

def add_parser(commands) -> argparse.ArgumentParser:
  port = commands.add_parser(
      NAME,
      help='write the NNX port of your Linen model, proven equivalent',
      description=(
          'Trace the Linen model FACTORY returns (LinenModel(module, *example_inputs, '
          '**kwargs)), write one NNX class per Linen class it uses to --out (a module '
          'importing only Flax, JAX and your modules), the path mapping PATHS to '
          '<out>_paths.py beside it, and prove the port: the Linen variables, '
          'converted through PATHS, give the same outputs, gradients and training '
          'step. A test file repeating the proof is written beside it.'
      ),
  )
  port.add_argument('factory', metavar='FACTORY', help='pkg.module:function returning a LinenModel')
  port.add_argument('--out', required=True, metavar='PATH', help='the NNX module to write (a .py file)')
  port.add_argument('--test-out', metavar='PATH',
                    help='the pytest file to write (default: test_<out>_port.py beside --out)')
  port.add_argument('--side-by-side', metavar='PATH',
                    help='also write an HTML page: each Linen class beside the NNX class written from it')
  port.add_argument('--force', action='store_true',
                    help='overwrite --out, its _paths.py, the test file and the page')
  port.add_argument('--json', action='store_true', help='print the report as JSON on stdout')
  port.add_argument(
      '--devices', type=int, default=8, help='simulated CPU devices (ignored unless JAX runs on CPU)'
  )
  port.set_defaults(run=run, needs=Needs.DEVICES)
  return port


def _package_root(module_name: str) -> str | None:
  """The directory of the top-level package `module_name` belongs to (or
  the module file's own directory for a top-level module)."""
  module = sys.modules.get(module_name.split('.')[0])
  path = getattr(module, '__file__', None)
  if path is None:
    paths = list(getattr(module, '__path__', []))
    return os.path.realpath(paths[0]) if paths else None
  if os.path.basename(path) == '__init__.py':
    return os.path.realpath(os.path.dirname(path))
  return None  # a lone module: only the file itself is the input


def _inside(path: str, directory: str) -> bool:
  return os.path.commonpath([os.path.realpath(path), directory]) == directory


def refusal(args, read_modules: list[str], read_files: list[str]) -> str | None:
  """Why `--out` (or the test file) cannot be written, or None:
  `read_modules` are the modules read (the factory's, the model's), whose
  packages are inputs whole; `read_files` the files read."""
  from converters.port.prove import paths_file

  outputs = [('--out', args.out), ("--out's mapping", paths_file(args.out)), ('--test-out', args.test_out)]
  if args.side_by_side is not None:
    outputs.append(('--side-by-side', args.side_by_side))
  roots = sorted({root for name in read_modules if (root := _package_root(name)) is not None})
  for option, path in outputs:
    real = os.path.realpath(path)
    suffix = '.html' if option == '--side-by-side' else '.py'
    if not path.endswith(suffix):
      kind = 'an HTML page (name it *.html)' if suffix == '.html' else 'a Python file (name it *.py)'
      return f'{option} {path}: write {kind}'
    if suffix == '.py' and not os.path.basename(path)[:-3].isidentifier():
      return f'{option} {path}: name it as a Python module is named (models_nnx.py), so that it imports'
    for root in roots:
      if _inside(real, root):
        return (
            f'{option} {path} is inside the package being read ({root}); write the port '
            'outside it, e.g. --out ports/models_nnx.py'
        )
    if real in read_files:
      return f'{option} {path} is a file the model is read from; choose another path'
    if os.path.isdir(real):
      return f'{option} {path} is a directory; give a file name such as models_nnx.py'
    parent = os.path.dirname(real)
    if not os.path.isdir(parent):
      return f'{option} {path}: the directory {parent} does not exist; create it first'
    if os.path.lexists(path) and not args.force:
      return f'{option} {path} exists; pass --force to overwrite it'
  if len({os.path.realpath(path) for _, path in outputs}) != len(outputs):
    return ' and '.join(option for option, _ in outputs) + ': two of them are the same file'
  return None


def side_by_side_page(result, out: str, factory: str) -> str:
  """The HTML page of `result`: each Linen class beside its port."""
  import ast
  import inspect

  from linen_nnx_cli.side_by_side import ClassPair, Region, render_port_html

  written = {
      node.name: node for node in ast.parse(result.text).body if isinstance(node, ast.ClassDef)
  }
  lines = result.text.splitlines()
  stubs = {s.cls: s.reason for s in result.stubs}
  pairs = []
  for cls in result.linen_classes:
    name = cls.__name__
    try:
      source, start = inspect.getsourcelines(cls)
      path = inspect.getsourcefile(cls) or '<unknown>'
    except (OSError, TypeError):
      source, start, path = ['# the source of this class cannot be read\n'], 0, '<unknown>'
    node = written[name]
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    nnx_code = '\n'.join(lines[first - 1:node.end_lineno])
    pairs.append(ClassPair(
        name, Region(_shown(path), start, ''.join(source).rstrip('\n')),
        Region(_shown(out), first, nnx_code), stubs.get(name),
    ))
  return render_port_html(f'{factory} ported to NNX', pairs, result.checks, result.failure)


def _shown(path: str) -> str:
  """`path` relative to the working directory where it is under it."""
  real = os.path.realpath(path)
  here = os.path.realpath(os.getcwd())
  return os.path.relpath(real, here) if _inside(real, here) else path


def _installed(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except ImportError:
    return False


def run(args) -> int:
  """The command: its exit status, a refusal reported in one line (`fail`)."""
  from converters.linen_model import LinenModel
  from converters.port import (
    PORT_INSTALL_HINT,
    PortInputError,
    PortOutputError,
    PortToolError,
  )
  from linen_nnx_cli.user_models import UserObjectError, load

  missing = [name for name in ('libcst', 'ruff') if not _installed(name)]
  if missing:
    return fail(args, f'port needs {" and ".join(missing)}, which the kit installs only with its '
                f'port extra: {PORT_INSTALL_HINT}', 2)
  from converters.port import port, source
  from converters.port.prove import paths_file

  stem = os.path.splitext(os.path.basename(args.out))[0]
  if args.test_out is None:
    args.test_out = os.path.join(os.path.dirname(args.out) or '.', f'test_{stem}_port.py')
  try:
    factory = load('port', args.factory)
  except UserObjectError as e:
    return fail(args, str(e), 2)
  try:
    linen_model = factory()
  except Exception as e:  # the user's factory: any error of theirs
    return fail(args, f'port {args.factory}: calling it failed: {type(e).__name__}: {e}', 2)
  if not isinstance(linen_model, LinenModel):
    return fail(
        args, f'port {args.factory}: returned {type(linen_model).__name__}; return '
        'LinenModel(module, *example_inputs, **kwargs)', 2,
    )
  # The factory's module and the model's are inputs (their packages whole);
  # the files the port is written from are refused again by `port`.
  factory_module = args.factory.partition(':')[0]
  model_module = type(linen_model.module).__module__
  read = [source.file_of(type(linen_model.module)).path]
  read += [os.path.realpath(f) for name in (factory_module, model_module)
           if (f := getattr(sys.modules.get(name), '__file__', None))]
  problem = refusal(args, [factory_module, model_module], read)
  if problem:
    return fail(args, problem, 2)
  try:
    result = port(linen_model, args.out, factory=args.factory, test_out=args.test_out)
  except (PortInputError, PortOutputError, PortToolError) as e:
    return fail(args, str(e), 2)
  code = 0 if result.proven and not result.branches else 1
  if args.side_by_side is not None:
    from converters.port.emit import write_text

    write_text(args.side_by_side, side_by_side_page(result, args.out, args.factory))
  if args.json:
    print(json.dumps({
        'ok': code == 0, 'exit_code': code, 'out': args.out, 'paths': paths_file(args.out),
        'test': args.test_out,
        'side_by_side': args.side_by_side,
        'classes': result.classes, 'modes': result.modes,
        'stubs': [{'class': s.cls, 'file': s.file, 'line': s.line, 'reason': s.reason} for s in result.stubs],
        'branches': [{'class': b.cls, 'file': b.file, 'line': b.line, 'branch': b.branch, 'test': b.test,
                      'else': b.is_else, 'refused': b.refused} for b in result.branches],
        'checks': [{'check': c, 'outcome': o, 'figure': f} for c, o, f in result.checks],
        'failure': result.failure,
    }, indent=2))
  else:
    page = f' and {args.side_by_side}' if args.side_by_side else ''
    print(f'wrote {args.out} ({", ".join(result.classes)}), {paths_file(args.out)}, {args.test_out}{page}')
    for check, outcome, figure in result.checks:
      print(f'  {check}: {outcome}' + (f' ({figure})' if figure else ''))
    for stub in result.stubs:
      print(f'  stub: {stub}')
    for branch in result.branches:
      print(f'  branch not written: {branch}')
    if result.failure:
      print(f'  {result.failure}')
  if result.stubs:
    names = ', '.join(s.cls for s in result.stubs)
    print(f'linen-nnx port: {names} written as stubs: port them by hand (see above)', file=sys.stderr)
  elif result.branches and result.proven:
    print('linen-nnx port: proven where written; branches it does not write raise NotImplementedError: '
          'trace a configuration that takes them, or port them by hand (see above)', file=sys.stderr)
  elif code:
    print('linen-nnx port: the port was written but not proven (see above)', file=sys.stderr)
  return code
