"""`linen-nnx port`: exit 0 proven, 1 with stubs, 2 refused before writing."""

from __future__ import annotations

import ast
import html
import os
import re
import stat
import sys

from tests.linen_nnx_cli.runner import assert_refused, run

FACTORIES = 'tests.converters.port.linen_models'


def _imported(path) -> set[str]:
  """The top-level packages a Python file imports, Python's own left out."""
  tree = ast.parse(path.read_text())
  names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
  names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
  return {name.split('.')[0] for name in names} - set(sys.stdlib_module_names)


def test_a_model_its_own_init_refuses_is_refused_in_one_line(tmp_path):
  result = run('port', f'{FACTORIES}:norm_over_replicas', '--out', tmp_path / 'n.py')
  assert result.code == 2 and not (tmp_path / 'n.py').exists()
  assert result.stderr.strip().splitlines()[-1].startswith(
      'linen-nnx port: NormOverReplicas.init on the example inputs failed: NameError')
  assert "LayerNorm(axis_name='batch') reduces over a mapped axis" in result.stderr


def test_writes_proves_reports_and_pairs_each_linen_class_with_its_port_on_a_page(tmp_path):
  out, page = tmp_path / 'm_nnx.py', tmp_path / 'port.html'
  mask = os.umask(0o027)  # the user's: files are made as `open` makes them, not 0600
  try:
    result = run('port', f'{FACTORIES}:modes_by_field', '--out', out, '--side-by-side', page, '--json')
  finally:
    os.umask(mask)
  assert result.code == 0, result.stderr
  report = result.json
  assert report['ok'] and report['classes'] == ['Inner', 'HandsOnModes', 'ModesByField']
  assert report['modes'] == {'train': True}
  assert {c['check']: c['outcome'] for c in report['checks']}['assert_port_equivalent'] == 'passed'
  test = tmp_path / 'test_m_nnx_port.py'
  assert report['test'] == str(test) and test.exists()
  # The model module depends on Flax, JAX and the user's modules alone; the
  # mapping, the kit's to read, is the module beside it.
  paths = tmp_path / 'm_nnx_paths.py'
  assert report['paths'] == str(paths)
  assert _imported(out) <= {'flax', 'jax', 'tests'}, _imported(out)
  assert _imported(paths) == {'converters'} and 'PATHS = PathMapping([' in paths.read_text()
  for written in (out, paths, test, page):
    assert stat.S_IMODE(written.stat().st_mode) == 0o640, written
  assert report['side_by_side'] == str(page)
  text = page.read_text()
  assert text.startswith('<!DOCTYPE html>') and '<script' not in text
  # Innermost first, each Linen class (its source file) beside the NNX class (the port's).
  sections = text.split('<section id="class-')[1:]
  assert [s.split('"', 1)[0] for s in sections] == ['Inner', 'HandsOnModes', 'ModesByField']
  for section in sections:
    linen, nnx = (html.unescape(re.sub('<[^>]+>', '', side)) for side in section.split('<div><h3>')[1:3])
    assert linen.startswith('Linen') and 'linen_models.py:' in linen and 'nn.compact' in linen
    assert nnx.startswith('NNX') and 'm_nnx.py:' in nnx and '__init__' in nnx and 'nn.compact' not in nnx
  assert '<td>assert_port_equivalent</td><td>passed</td>' in text


def test_a_page_path_is_refused_as_the_out_path_is(tmp_path):
  out = tmp_path / 'm_nnx.py'
  stack = f'{FACTORIES}:stack'
  assert_refused(run('port', stack, '--out', out, '--side-by-side', tmp_path / 'p.txt'), 'write an HTML page')
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
  inside = os.path.join(package, 'converters', 'port', 'page.html')
  assert_refused(run('port', stack, '--out', out, '--side-by-side', inside), 'inside the package being read')
  assert not os.listdir(tmp_path) and not os.path.exists(inside)
  page = tmp_path / 'page.html'
  page.write_text('mine\n')
  assert_refused(run('port', stack, '--out', out, '--side-by-side', page), 'exists; pass --force')
  assert page.read_text() == 'mine\n' and not out.exists()


def test_refusals_write_nothing(tmp_path):
  out = tmp_path / 'm.py'
  assert_refused(run('port', f'{FACTORIES}:failing', '--out', out), 'calling it failed', 'the factory broke')
  assert_refused(run('port', f'{FACTORIES}:nothing_here', '--out', out), 'has no')
  assert_refused(run('port', f'{FACTORIES}:stack', '--out', tmp_path / 'm.txt'), 'write a Python file')
  assert not os.listdir(tmp_path)
  out.write_text('mine\n')
  assert_refused(run('port', f'{FACTORIES}:stack', '--out', out), 'exists; pass --force')
  assert out.read_text() == 'mine\n'
  out.unlink()
  (tmp_path / 'm_paths.py').write_text('mine\n')  # where the mapping would go
  assert_refused(run('port', f'{FACTORIES}:stack', '--out', out), "--out's mapping", 'exists; pass --force')
  assert (tmp_path / 'm_paths.py').read_text() == 'mine\n' and not out.exists()


def test_an_out_inside_the_package_read_is_refused_however_spelled(tmp_path):
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
  inside = os.path.join(package, 'converters', 'port', 'generated_nnx.py')
  spelled = os.path.join(package, 'converters', '..', 'converters', 'port', 'generated_nnx.py')
  link = tmp_path / 'link'
  link.symlink_to(os.path.join(package, 'converters'))
  for path in (inside, os.path.relpath(spelled), link / 'port' / 'generated_nnx.py'):
    assert_refused(run('port', f'{FACTORIES}:stack', '--out', path), 'inside the package being read')
  assert not os.path.exists(inside)


def test_the_factory_and_the_models_package_are_inputs_even_with_force(tmp_path, monkeypatch):
  # A lone factory module, beside where the port goes, making a model of a package.
  factory = tmp_path / 'make_paths.py'
  text = f'from {FACTORIES} import stack\n\n\ndef make():\n  return stack()\n'
  factory.write_text(text)
  monkeypatch.syspath_prepend(str(tmp_path))
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, the model's
  for out, words in [
      (factory, 'is a file the model is read from'),  # --out is the factory
      (tmp_path / 'make.py', "--out's mapping"),  # its mapping, make_paths.py, would be
      (os.path.join(package, 'converters', 'port', 'made_nnx.py'), 'inside the package being read'),
  ]:
    assert_refused(run('port', 'make_paths:make', '--out', out, '--force'), words)
  assert factory.read_text() == text and [p for p in os.listdir(tmp_path) if p != '__pycache__'] == ['make_paths.py']
  assert not os.path.exists(os.path.join(package, 'converters', 'port', 'made_nnx.py'))
  assert_refused(run('port', f'{FACTORIES}:stack', '--out', tmp_path / '.py'), 'name it as a Python module')


def test_stubs_exit_1_named_and_on_the_page_and_force_replaces_a_symlinked_output_never_its_target(tmp_path):
  # One port run for both claims: a port with stubs exits 1 naming them,
  # its page shows them; and it is written as a proven one is, through the
  # same writer, which --force lets replace a symlink, not what it points to.
  victim = tmp_path / 'mine.py'
  victim.write_text('mine\n')
  page_victim = tmp_path / 'mine.html'
  page_victim.write_text('mine\n')
  out, page = tmp_path / 'm_nnx.py', tmp_path / 'port.html'
  out.symlink_to(victim)
  page.symlink_to(page_victim)
  result = run('port', f'{FACTORIES}:scanned_noise', '--out', out, '--side-by-side', page, '--force')
  assert result.code == 1, result.stderr
  assert 'NoisyStep, ScannedNoise written as stubs: port them by hand' in result.stderr
  assert 'stub: NoisyStep' in result.stdout and 'self.make_rng' in result.stdout
  assert victim.read_text() == 'mine\n' and page_victim.read_text() == 'mine\n'
  assert not out.is_symlink() and 'class ScannedNoise(nnx.Module)' in out.read_text()
  assert not page.is_symlink()
  text = page.read_text()
  assert text.startswith('<!DOCTYPE html>')
  assert '<strong>Stub, to port by hand:</strong>' in text and 'make_rng' in text
  assert not [p for p in os.listdir(tmp_path) if p.startswith('.linen-nnx-')]  # no temporary left


def test_without_the_port_extra_one_line_names_the_install_command(tmp_path, monkeypatch):
  from linen_nnx_cli import port_command

  monkeypatch.setattr(port_command, '_installed', lambda name: name != 'libcst')
  result = run('port', f'{FACTORIES}:stack', '--out', tmp_path / 's.py')
  assert result.code == 2 and not (tmp_path / 's.py').exists()
  assert ' '.join(result.stderr.split()) == (
      "linen-nnx port: port needs libcst, which the kit installs only with its port extra: "
      "pip install -e '.[port]' (the port extra: libcst and ruff)")
