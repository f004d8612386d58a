"""`linen-nnx port`: exit 0 proven, 1 with stubs, 2 refused before writing."""

from __future__ import annotations

import os

from tests.linen_nnx_cli.runner import assert_refused, run

FACTORIES = 'tests.converters.port.linen_models'


def test_writes_proves_and_reports(tmp_path):
  out = tmp_path / 'stack_nnx.py'
  result = run('port', f'{FACTORIES}:stack', '--out', out, '--json')
  assert result.code == 0, result.stderr
  report = result.json
  assert report['ok'] and report['classes'] == ['Stack'] and report['modes'] == {'train': True}
  assert {c['check']: c['outcome'] for c in report['checks']}['assert_port_equivalent'] == 'passed'
  assert (tmp_path / 'test_stack_nnx_port.py').exists()
  assert report['test'] == str(tmp_path / 'test_stack_nnx_port.py')


def test_stubs_exit_1_naming_them(tmp_path):
  result = run('port', f'{FACTORIES}:uses_make_rng', '--out', tmp_path / 'p.py')
  assert result.code == 1
  assert 'UsesMakeRng written as stubs: port them by hand' in result.stderr
  assert 'stub: UsesMakeRng' in result.stdout and 'self.make_rng' in result.stdout


def test_refusals_write_nothing(tmp_path):
  out = tmp_path / 'm.py'
  assert_refused(run('port', f'{FACTORIES}:failing', '--out', out), 'calling it failed', 'the factory broke')
  assert_refused(run('port', f'{FACTORIES}:nothing_here', '--out', out), 'has no')
  assert_refused(run('port', f'{FACTORIES}:stack', '--out', tmp_path / 'm.txt'), 'write a Python file')
  assert not os.listdir(tmp_path)
  out.write_text('mine\n')
  assert_refused(run('port', f'{FACTORIES}:stack', '--out', out), 'exists; pass --force')
  assert out.read_text() == 'mine\n'


def test_an_out_inside_the_package_read_is_refused_however_spelled(tmp_path):
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
  inside = os.path.join(package, 'converters', 'port', 'generated_nnx.py')
  spelled = os.path.join(package, 'converters', '..', 'converters', 'port', 'generated_nnx.py')
  link = tmp_path / 'link'
  link.symlink_to(os.path.join(package, 'converters'))
  for path in (inside, os.path.relpath(spelled), link / 'port' / 'generated_nnx.py'):
    assert_refused(run('port', f'{FACTORIES}:stack', '--out', path), 'inside the package being read')
  assert not os.path.exists(inside)
