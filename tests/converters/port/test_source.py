"""`converters.port.source`: how a Linen class's name becomes an attribute's, and
which names a definition reads from its module."""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import libcst as cst
import pytest

from converters.port import source, syntax
from converters.port.source import snake_case


#: A file defining one Linen class, `Net`.
NET_SOURCE = (
    'from flax import linen as nn\n\n\nclass Net(nn.Module):\n  @nn.compact\n  def __call__(self, x):\n'
    '    return nn.Dense(2)(x)\n'
)


@pytest.mark.parametrize('name, snake', [
    ('Dense_0', 'dense_0'),
    ('MultiHeadDotProductAttention', 'multi_head_dot_product_attention'),
    ('ResNetBlock', 'res_net_block'),
    # An acronym is one word.
    ('LSTMCell', 'lstm_cell'),
    ('OptimizedLSTMCell', 'optimized_lstm_cell'),
    ('ConvBNBlock', 'conv_bn_block'),
    ('DnCNNNet', 'dn_cnn_net'),
    ('RMSNorm', 'rms_norm'),
    ('MLP', 'mlp'),
    # One capital closing a word belongs to it (ViT, DiT), as a digit's suffix does.
    ('ViTBlock', 'vit_block'),
    ('DiTBlock', 'dit_block'),
    ('ViT', 'vit'),
    ('Conv2D', 'conv2d'),
    ('Encoder1DBlock', 'encoder1d_block'),
])
def test_class_names_become_the_attribute_names_a_person_writes(name, snake):
  assert snake_case(name) == snake


def test_a_class_a_package_re_exports_under_its_own_name_is_read_from_the_file_defining_it(tmp_path, monkeypatch):
  # scico's `scico.flax` sets `DnCNNNet.__module__ = 'scico.flax'`: its
  # module's file is the package's __init__, which does not define it.
  package = tmp_path / 'reexporting'
  package.mkdir()
  (package / '_models.py').write_text(NET_SOURCE)
  (package / '__init__.py').write_text('from reexporting._models import Net\n\nNet.__module__ = __name__\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  import reexporting

  assert reexporting.Net.__module__ == 'reexporting'
  file = source.file_of(reexporting.Net)
  assert file.path == os.path.realpath(package / '_models.py')
  assert file.class_def(reexporting.Net).name.value == 'Net'


def test_a_file_imported_under_two_names_is_read_with_the_module_of_the_class(tmp_path, monkeypatch):
  # One file imported through a link and through its real path (or as
  # `__main__` and by name): each class is written from its own module, whose
  # name the port imports, whichever was imported first.
  real = tmp_path / 'real'
  real.mkdir()
  (real / 'models.py').write_text(NET_SOURCE)
  (tmp_path / 'link').symlink_to(real, target_is_directory=True)
  modules = {}
  for name, folder in [('models_through_a_link', 'link'), ('models_by_real_path', 'real')]:
    spec = importlib.util.spec_from_file_location(name, tmp_path / folder / 'models.py')
    modules[name] = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, modules[name])
    spec.loader.exec_module(modules[name])

  for name, module in modules.items():
    file = source.file_of(module.Net)
    assert file.path == os.path.realpath(real / 'models.py')
    assert file.python_module is module, name


def test_free_names_are_those_a_definition_reads_from_its_module():
  node = cst.parse_module(
      'class Net(nn.Module):\n'
      '  size: int = WIDTH\n'
      '  def __call__(self, x):\n'
      '    h = nn.Dense(3)(x)\n'
      '    ys = [h * k for k in range(2)]\n'
      '    def inner(z):\n'
      '      return z + helper(z)\n'
      '    return inner(h) + len(ys)\n'
  ).body[0]
  # Locals, parameters, a comprehension's variable, a nested function and
  # attribute names are not the module's; builtins are read from it.
  assert source.free_names(node) == {'nn', 'WIDTH', 'int', 'range', 'helper', 'len'}


def test_a_local_shadowing_a_module_function_is_not_a_read_of_it():
  node = cst.parse_module('def f(x):\n  h = x\n  return h\n').body[0]
  assert 'h' in syntax.names_in(node) and 'h' not in source.free_names(node)


def test_ancestors_below_stop_at_the_ancestor_innermost_first(tmp_path):
  path = tmp_path / 'nested.py'
  path.write_text('def f(x):\n  if x:\n    return g(x)\n')
  file = source.SourceFile(str(path), types.ModuleType('nested'))
  function = file.module.body[0]
  call = next(n for n in file.positions if isinstance(n, cst.Call))
  kinds = [type(a).__name__ for a in file.ancestors_below(call, function)]
  assert kinds[-2:] == ['If', 'IndentedBlock'] and 'FunctionDef' not in kinds
  assert kinds[0] == 'Return'
