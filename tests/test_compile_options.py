"""`tests.compile_options`: what `make test` adds to `XLA_FLAGS`, what it
keeps as given, and how a test reads whether every cheaper option is on."""

from __future__ import annotations

import os

import pytest

from tests import compile_options


def test_each_option_not_named_is_added_and_one_named_is_kept(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8 --xla_cpu_use_fusion_emitters=true')
  compile_options.add_cheap()
  assert os.environ['XLA_FLAGS'].split() == [
      '--xla_force_host_platform_device_count=8',
      '--xla_cpu_use_fusion_emitters=true',
      '--xla_backend_optimization_level=0',
  ]
  assert not compile_options.all_cheap()


def test_with_none_named_each_is_added_once(monkeypatch):
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  compile_options.add_cheap()
  compile_options.add_cheap()
  assert os.environ['XLA_FLAGS'].split() == [f'{name}={value}' for name, value in compile_options.CHEAP.items()]
  assert compile_options.all_cheap()


@pytest.mark.parametrize('flags, cheap', [
    # XLA reads `0` and `False` as `false`, `00` as `0`, and the last of a name given twice.
    ('--xla_backend_optimization_level=00 --xla_cpu_use_fusion_emitters=0', True),
    ('--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=False', True),
    ('--xla_backend_optimization_level=3 --xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0', True),
    ('--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=3', False),
    # A boolean named alone is true.
    ('--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters', False),
    ('--xla_backend_optimization_level=0', False),
    ('', False),
])
def test_every_cheaper_option_is_read_as_xla_reads_it(monkeypatch, flags, cheap):
  monkeypatch.setenv('XLA_FLAGS', flags)
  assert compile_options.all_cheap() is cheap
