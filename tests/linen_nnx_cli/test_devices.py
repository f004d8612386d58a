"""`simulate_cpu_devices`: the device count set before JAX starts, and a
clear refusal once it has (this process runs on 8 simulated devices)."""

from __future__ import annotations

import os

import jax
import pytest

from linen_nnx_cli.devices import simulate_cpu_devices


def test_the_count_jax_already_runs_with_is_accepted_and_changes_nothing(monkeypatch):
  jax.devices()  # started
  monkeypatch.setenv('XLA_FLAGS', os.environ.get('XLA_FLAGS', ''))
  before = os.environ['XLA_FLAGS']
  simulate_cpu_devices(jax.device_count())
  assert os.environ['XLA_FLAGS'] == before


def test_another_count_once_jax_runs_is_refused_saying_when_to_call_it(monkeypatch):
  jax.devices()
  monkeypatch.setenv('XLA_FLAGS', os.environ.get('XLA_FLAGS', ''))
  before = os.environ['XLA_FLAGS']
  with pytest.raises(RuntimeError, match=r'JAX already runs with 8 devices; call simulate_cpu_devices before'):
    simulate_cpu_devices(2)
  assert os.environ['XLA_FLAGS'] == before


def test_a_count_below_one_is_refused():
  with pytest.raises(ValueError, match='device count must be >= 1, got 0'):
    simulate_cpu_devices(0)
