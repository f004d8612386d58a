"""The package layout's contracts hold: `lint-imports` keeps every one, and every module is in them.

The contracts live in `pyproject.toml` (`[tool.importlinter]`). A wrong import
fails here with the name of the contract it breaks.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _contracts() -> list[dict]:
  config = tomllib.loads((ROOT / 'pyproject.toml').read_text())
  return config['tool']['importlinter']['contracts']


def test_every_import_contract_is_kept():
  lint_imports = pathlib.Path(sys.executable).parent / 'lint-imports'
  result = subprocess.run(
      [str(lint_imports), '--no-cache'], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, 'COLUMNS': '1000'},  # one line per contract, its whole name
  )
  broken = [line for line in result.stdout.splitlines() if line.rstrip().endswith('BROKEN')]
  assert result.returncode == 0, (
      f'broken import contracts: {broken}\n{result.stdout[-4000:]}{result.stderr[-2000:]}'
  )
  assert f'Contracts: {len(_contracts())} kept, 0 broken.' in result.stdout


def test_every_contract_name_fits_one_line_of_lint_imports_output():
  # lint-imports wraps a long name at 80 columns, so its "NAME KEPT" line is
  # split in two and tools that read one line per contract miscount.
  long = [c['name'] for c in _contracts() if len(c['name']) + len(' KEPT') > 79]
  assert not long, f'shorten these contract names: {long}'


def _core_modules() -> set[str]:
  """Every module the core's layers (those below `converters.presets`) name."""
  layers = _contracts()[0]['layers']
  core_layers = layers[layers.index('converters.presets') + 1:]
  return {name.strip() for layer in core_layers for name in re.split('[:|]', layer)}


def test_every_module_of_the_conversion_core_is_under_the_contracts():
  """A new module or package of `converters` is either above the core (the
  port writer, the checkpoint tool, the testing helpers, the catalogue
  `converters.presets`) or named in the core's layer."""
  upper = ' '.join(_contracts()[0]['layers'][1:3])
  above_the_core = {'converters.presets'}
  knows_no_model = set(_contracts()[1]['source_modules'])
  modules = {
      f'converters.{path.stem}'
      for path in (ROOT / 'converters').glob('*.py') if path.stem != '__init__'
  } | {
      f'converters.{path.parent.name}'
      for path in (ROOT / 'converters').glob('*/__init__.py')
      if f'converters.{path.parent.name}' not in upper
  }
  assert modules - above_the_core == _core_modules() == knows_no_model
  assert above_the_core <= modules


def test_the_checkpoint_tool_is_forbidden_every_model_as_a_whole():
  """The whole package, so that a new module of `converters.checkpoint` is
  under the contract too: the kit's MLP reaches it as users' models do."""
  forbidding = [
      c for c in _contracts()
      if c.get('type') == 'forbidden' and 'converters.checkpoint' in c.get('source_modules', [])
  ]
  assert forbidding and {'linen_impl', 'nnx_impl', 'kit_mlp', 'model_zoo', 'linen_nnx_cli'} <= set(
      forbidding[0]['forbidden_modules']
  )


def test_the_conversion_core_names_no_model_of_the_kit():
  """Not the guides' MLP, its description, its path presets or the kit's optimizers."""
  from kit_mlp.optimizers import OPTIMIZERS

  names = ['DotReluDot', 'ModelDescription', 'GUIDE_PATHS', 'KIT_PATHS', 'kit_mlp', 'nnx_impl',
           'linen_impl', 'SGDState', *OPTIMIZERS]
  mentions = {}
  for module in sorted(_core_modules()):
    path = ROOT / module.replace('.', '/')
    files = sorted(path.glob('*.py')) if path.is_dir() else [path.with_suffix('.py')]
    text = '\n'.join(f.read_text() for f in files)
    found = [name for name in names if re.search(rf"\b{re.escape(name)}\b", text)]
    if found:
      mentions[module] = found
  assert not mentions, f'the core names the kit\'s model: {mentions}'
