"""`linen-nnx convert` and `compare` on users' models, named on the command line.

The models are the zoo's, described in a user module
(`tests.converters.checkpoint.zoo_models`), run as a team runs the tool:
`--linen-model pkg.module:factory --nnx-model ... --paths ... --optimizer ...`.
Includes the corrupted-source and SIGKILL tests of the MLP's checkpoints, on
the zoo's CNN; and the loading of objects named on the command line. What a
process alone shows (exit status, a kill) runs as a process; the rest in this
process (`runner`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from linen_nnx_cli.user_models import UserObjectError, load
from tests import warm_python
from tests.converters.checkpoint import test_models
from tests.converters.checkpoint.fixtures import tree_checksum
from tests.linen_nnx_cli.runner import run
from tests.linen_nnx_cli.test_main_checkpoints import KILL_DRIVER, KILL_POINTS, linen_nnx

ZOO = 'tests.converters.checkpoint.zoo_models'
CNN = [
    '--linen-model', f'{ZOO}:linen_cnn', '--nnx-model', f'{ZOO}:nnx_cnn',
    '--paths', f'{ZOO}:CNN_PATHS', '--optimizer', f'{ZOO}:make_tx',
]
TRANSFORMER = [
    '--linen-model', f'{ZOO}:linen_transformer', '--nnx-model', f'{ZOO}:nnx_transformer',
    '--paths', f'{ZOO}:TRANSFORMER_PATHS', '--rules', f'{ZOO}:TRANSFORMER_RULES',
    '--optimizer', f'{ZOO}:make_tx',
]


def trained_linen_checkpoint(path, name):
  pair = test_models.PAIRS[name]
  with test_models.in_mesh(pair['rules']):
    state = test_models.linen_train_state(pair, test_models.zoo.make_tx())
    state = pair['steps']()[0](state, pair['batches']()[0])
  test_models.save(path, state)
  return state


@pytest.fixture(scope='module')
def cnn_checkpoint(tmp_path_factory):
  path = tmp_path_factory.mktemp('src') / 'cnn'
  trained_linen_checkpoint(path, 'cnn')
  return path


@pytest.mark.nightly  # CI: test_convert_and_compare_with_paths_inferred (users' models converted and compared on the command line, the summary's models), test_main_checkpoints.py::test_compare_checkpoints_identical_and_different (a changed leaf named)
def test_convert_and_compare_a_transformer_and_a_changed_weight(tmp_path):
  state = trained_linen_checkpoint(tmp_path / 'linen', 'transformer')
  result = linen_nnx('convert', tmp_path / 'linen', tmp_path / 'nnx', '--to', 'nnx',
                     '--layout', 'scan', '--json', *TRANSFORMER)
  assert result.returncode == 0, result.stderr
  summary = json.loads(result.stdout)
  assert summary['source']['models']['linen'] == f'{ZOO}.linen_transformer'
  assert (summary['source']['layout'], summary['destination']['layout']) == ('loop', 'scan')
  assert 'verifying' in result.stderr  # progress on stderr

  result = run('compare', tmp_path / 'linen', tmp_path / 'nnx', *TRANSFORMER)
  assert result.code == 0, result.stderr
  assert 'params/Block_1/mlp/Dense_0/kernel' in result.stdout
  assert 'model/blocks/1/mlp/up/kernel' in result.stdout  # in A's layout
  assert 'all identical' in result.stdout

  # One weight changed in the Linen checkpoint (saved again with it changed).
  kernel = state.params['Block_0']['attention']['out']['kernel']
  changed = kernel.replace_boxed(kernel.value.at[0, 0, 0].add(1.0))
  params = {**state.params, 'Block_0': {**state.params['Block_0'], 'attention': {
      **state.params['Block_0']['attention'], 'out': {'kernel': changed}}}}
  test_models.save(tmp_path / 'changed', state.replace(params=params))
  result = run('compare', tmp_path / 'changed', tmp_path / 'nnx', '--json', *TRANSFORMER)
  assert result.code == 1 and 'linen-nnx compare: 1 leaves differ' in result.stderr
  differing = [r for r in json.loads(result.stdout)['leaves'] if not r['identical']]
  assert [r['linen_path'] for r in differing] == ['params/Block_0/attention/out/kernel']
  assert differing[0]['max_abs_diff'] == 1.0


def test_bad_models_exit_2_naming_the_option(cnn_checkpoint, tmp_path, capsys):
  from linen_nnx_cli import main as cli

  cases = [
      (['--linen-model', 'no_such_module:f', '--nnx-model', f'{ZOO}:nnx_cnn'],
       "--linen-model no_such_module:f: importing no_such_module failed: ModuleNotFoundError"),
      (['--linen-model', f'{ZOO}:missing', '--nnx-model', f'{ZOO}:nnx_cnn'],
       f"--linen-model {ZOO}:missing: {ZOO} has no 'missing'"),
      (['--linen-model', f'{ZOO}', '--nnx-model', f'{ZOO}:nnx_cnn'],
       'name an object as pkg.module:attribute'),
      (CNN[:2], 'linen_model= is given without nnx_model='),
      (CNN[:-2] + ['--optimizer', 'adam'], "names one of the kit's optimizers"),
      (CNN + ['--rules', 'fsdp'], 'name your rules as pkg.module:RULES'),
      (CNN + ['--annotation', 'logical'], "describe the kit's MLP"),
      (TRANSFORMER, 'does not hold the linen training state of the Linen model'),
  ]
  for options, message in cases:  # in this process: the command line's own main
    code = cli.main(['convert', str(cnn_checkpoint), str(tmp_path / 'dst'), '--to', 'nnx', *options])
    stderr = capsys.readouterr().err
    assert code == 2, (options, stderr)
    failure = [line for line in stderr.splitlines() if line.startswith('linen-nnx convert:')]
    assert len(failure) == 1 and message in failure[0], (message, stderr)  # one line, no traceback
  assert not os.path.exists(tmp_path / 'dst')


def test_truncated_source_exits_2_and_writes_nothing(cnn_checkpoint, tmp_path):
  src = tmp_path / 'src'
  shutil.copytree(cnn_checkpoint, src)
  for path in (src / 'd').iterdir():
    with open(path, 'r+b') as f:
      f.truncate(100)
  result = run('convert', src, tmp_path / 'dst', '--to', 'nnx', '--json', *CNN)
  assert result.code == 2
  assert 'corrupted or incomplete' in result.reason
  assert 'Traceback' not in result.stderr
  assert json.loads(result.stdout)['ok'] is False
  assert sorted(os.listdir(tmp_path)) == ['src']


@pytest.mark.parametrize('point', KILL_POINTS)
def test_sigkill_leaves_src_intact_and_dst_absent_or_complete(cnn_checkpoint, tmp_path, point):
  before = tree_checksum(cnn_checkpoint)
  dst = tmp_path / 'dst'
  process = subprocess.Popen(
      warm_python.command([sys.executable, '-c', KILL_DRIVER, point, 'convert', str(cnn_checkpoint), str(dst),
                           '--to', 'nnx', *CNN]),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
  )
  try:
    _, status = os.waitpid(process.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f'the conversion ended before reaching {point!r}'
    process.send_signal(signal.SIGKILL)
  finally:
    if process.poll() is None:
      process.kill()
    process.communicate(timeout=60)
  assert process.returncode == -signal.SIGKILL
  assert os.path.exists(dst) == (point == 'renamed')
  assert tree_checksum(cnn_checkpoint) == before
  if point == 'renamed':  # complete: what a clean conversion writes
    clean = run('convert', cnn_checkpoint, tmp_path / 'clean', '--to', 'nnx', *CNN)
    assert clean.code == 0, clean.stderr
    result = run('compare', dst, tmp_path / 'clean', *CNN)
    assert result.code == 0, result.stderr
  result = run('convert', cnn_checkpoint, dst, '--to', 'nnx', '--force', *CNN)
  assert result.code == 0, result.stderr
  assert sorted(os.listdir(tmp_path)) == (['clean', 'dst'] if point == 'renamed' else ['dst'])


def test_load_finds_objects_in_the_current_directory(tmp_path, monkeypatch):
  (tmp_path / 'my_models.py').write_text('class Models:\n  RULES = (("embed", None),)\n')
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, 'path', [p for p in sys.path if p not in ('', str(tmp_path))])
  assert load('--rules', 'my_models:Models.RULES') == (('embed', None),)
  (tmp_path / 'broken.py').write_text('raise RuntimeError("a bug of theirs")\n')
  with pytest.raises(UserObjectError, match='importing broken failed: RuntimeError: a bug of'):
    load('--linen-model', 'broken:f')


def test_map_prints_the_inferred_mapping_as_python_and_json(capsys):
  from linen_nnx_cli import main as cli
  from model_zoo import paths as zoo_paths

  options = TRANSFORMER[:4] + TRANSFORMER[6:8]  # the models and their rules
  assert cli.main(['map', *options, '--name', 'MAPPING']) == 0
  namespace: dict = {}
  exec(capsys.readouterr().out, namespace)
  # Inferred from factories of both layouts, each layout's, merged: the
  # hand-written rules, stacked paths included.
  hand_written = {(r.linen, r.nnx, r.linen_stacked, r.nnx_stacked) for r in zoo_paths.TRANSFORMER['params']}
  assert {(r.linen, r.nnx, r.linen_stacked, r.nnx_stacked) for r in namespace['MAPPING'].rules} == hand_written
  assert cli.main(['map', *options, '--layout', 'scan', '--json']) == 0
  rules = json.loads(capsys.readouterr().out)['rules']
  assert {'linen': 'ScanCheckpointBlock_0/mlp/Dense_0/kernel', 'nnx': 'blocks/mlp/up/kernel'} in rules
  code = cli.main(['map', '--linen-model', f'{ZOO}:linen_cnn', '--nnx-model', f'{ZOO}:nnx_rnn'])
  failure = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and failure[-1].startswith('linen-nnx map: the ')  # one line


def test_known_rules_and_infer_together_and_two_mappings_refused(capsys, tmp_path, monkeypatch):
  from linen_nnx_cli import main as cli
  from tests.converters.checkpoint import zoo_models

  monkeypatch.chdir(tmp_path)  # the user's module of known rules, beside the checkpoints
  (tmp_path / 'known_rules.py').write_text(
      f'from {ZOO} import CNN_PATHS\nfrom converters import PathMapping\n'
      'KNOWN = PathMapping(CNN_PATHS.rules[:1])\n'
  )
  models = CNN[:4]
  assert cli.main(['map', *models, '--paths', 'known_rules:KNOWN', '--paths', 'infer', '--json']) == 0
  rules = json.loads(capsys.readouterr().out)['rules']
  expected = [{'linen': r.linen, 'nnx': r.nnx} for r in zoo_models.CNN_PATHS.rules]
  assert rules[0] == expected[0]  # the known rule first, the rest inferred
  assert sorted(rules, key=str) == sorted(expected, key=str)
  code = cli.main(['map', *models, '--paths', 'known_rules:KNOWN', '--paths', f'{ZOO}:CNN_PATHS'])
  assert code == 2 and 'give one mapping' in capsys.readouterr().err


def test_compare_outputs_catches_a_wrong_mapping_that_comparing_through_it_cannot(
    cnn_checkpoint, tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  # A mapping that converts and round-trips, but reorders the hidden kernel's rows.
  (tmp_path / 'wrong_paths.py').write_text(
      f'from {ZOO} import CNN_PATHS\n'
      'from converters import PathMapping, PathRule, Rearrange\n'
      'WRONG = PathMapping([\n'
      "    PathRule(r.linen, r.nnx, transform=Rearrange('(a b) c -> (b a) c', a=2))\n"
      "    if r.linen == 'Dense_0/kernel' else r for r in CNN_PATHS.rules\n"
      '])\n'
  )
  wrong = [*CNN[:4], '--paths', 'wrong_paths:WRONG', *CNN[6:]]
  assert run('convert', cnn_checkpoint, tmp_path / 'nnx', '--to', 'nnx', *wrong).code == 0
  circular = run('compare', cnn_checkpoint, tmp_path / 'nnx', *wrong)
  assert circular.code == 0 and 'all identical' in circular.stdout  # through the same mapping
  outputs = run('compare', cnn_checkpoint, tmp_path / 'nnx', *wrong, '--outputs')
  assert outputs.code == 1 and '6 outputs: 6 differ' in outputs.stdout, outputs.stderr
  for run_of in ('the example inputs', 'made generic', 'selectors drawn anew', 'gradient', 'training'):
    assert run_of in outputs.stdout  # every input set, backward and in training
  refused = run('compare', cnn_checkpoint, tmp_path / 'nnx', '--outputs')
  assert refused.code == 2 and 'give --linen-model and --nnx-model' in refused.stderr


def test_convert_and_compare_with_paths_inferred(cnn_checkpoint, tmp_path):
  inferred = [a if a != f'{ZOO}:CNN_PATHS' else 'infer' for a in CNN]
  result = run('convert', cnn_checkpoint, tmp_path / 'nnx', '--to', 'nnx', '--json', *inferred)
  assert result.code == 0, result.stderr
  assert result.json['source']['models']['linen'] == f'{ZOO}.linen_cnn'  # the models named
  result = run('compare', cnn_checkpoint, tmp_path / 'nnx', *CNN)  # the hand-written mapping
  assert result.code == 0 and 'all identical' in result.stdout, result.stderr
  outputs = run('compare', cnn_checkpoint, tmp_path / 'nnx', *CNN, '--outputs', '--json')
  assert outputs.code == 0 and outputs.json['identical'], outputs.stderr  # and no mapping
