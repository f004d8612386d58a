"""`model_zoo` stands alone: it imports only jax, flax, optax, numpy and the standard library."""

from __future__ import annotations

import ast
import pathlib
import sys

import model_zoo

ROOT = pathlib.Path(model_zoo.__file__).parent
ALLOWED = {'jax', 'flax', 'optax', 'numpy', 'model_zoo'}


def _modules():
  return sorted(ROOT.rglob('*.py'))


def test_every_import_is_allowed():
  found = {}
  for path in _modules():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
      else:
        continue
      for name in names:
        root = name.split('.')[0]
        if root not in ALLOWED and root not in sys.stdlib_module_names:
          found.setdefault(str(path.relative_to(ROOT)), []).append(name)
  assert not found, f'imports outside jax, flax, optax, numpy: {found}'


def test_every_module_has_a_docstring():
  missing = [str(p.relative_to(ROOT)) for p in _modules() if not ast.get_docstring(ast.parse(p.read_text()))]
  assert not missing


def test_linen_and_nnx_mirror_each_other():
  """The same files, and the same top-level classes and functions in the same order."""

  def names(path):
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
            and not n.name.startswith('_')]

  linen = sorted(p.name for p in (ROOT / 'linen').glob('*.py'))
  assert linen == sorted(p.name for p in (ROOT / 'nnx').glob('*.py'))
  assert linen == ['__init__.py', 'cnn.py', 'mlp.py', 'resnet.py', 'rnn.py', 'transformer.py']
  for name in linen:
    linen_names, nnx_names = names(ROOT / 'linen' / name), names(ROOT / 'nnx' / name)
    if name == 'resnet.py':
      # Linen's TrainState has no NNX class: nnx.Optimizer holds that state.
      linen_names.remove('TrainState')
    if name == 'mlp.py':
      # Linen infers the bridged Linen layer's input size at `init`; NNX
      # creates it on an example input (`bridge.lazy_init`).
      nnx_names.remove('create_bridged')
    if name == 'transformer.py':
      # The port with fused attention (`attention='fused_qkv'`) has no Linen
      # twin: the Linen original is the one it was ported from.
      nnx_names.remove('FusedAttention')
    assert linen_names == nnx_names, name
