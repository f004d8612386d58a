"""`tests.compile_options`: what `make test` adds to `XLA_FLAGS`, and what it keeps as given."""

from __future__ import annotations

import os

from tests import compile_options


def test_each_option_not_given_is_added_and_one_given_is_kept(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8 --xla_cpu_use_fusion_emitters=true')
  compile_options.set_fast()
  assert os.environ['XLA_FLAGS'].split() == [
      '--xla_force_host_platform_device_count=8',
      '--xla_cpu_use_fusion_emitters=true',
      '--xla_backend_optimization_level=0',
  ]
  assert not compile_options.legacy_fusion_emitters()


def test_with_none_given_each_is_added_once(monkeypatch):
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  compile_options.set_fast()
  compile_options.set_fast()
  assert os.environ['XLA_FLAGS'].split() == [f'{name}={value}' for name, value in compile_options.FAST.items()]
  assert compile_options.legacy_fusion_emitters()


def test_the_suites_processes_compile_with_each_unless_told_otherwise():
  given = compile_options._given(os.environ['XLA_FLAGS'])
  assert set(compile_options.FAST) <= set(given)
