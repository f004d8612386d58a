"""Tests of `linen_nnx_cli.plot`: the demo's loss plot, with and without matplotlib."""

from __future__ import annotations

import sys

import pytest

from linen_nnx_cli.plot import plot_losses


def test_writes_a_png_of_both_curves(tmp_path):
  pytest.importorskip('matplotlib')
  path = plot_losses([0.5, 0.4, 0.3], [0.5, 0.4, 0.3], tmp_path / 'losses.png')
  assert path == str(tmp_path / 'losses.png')
  assert (tmp_path / 'losses.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_without_matplotlib_returns_none_and_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'matplotlib', None)  # import fails
  assert plot_losses([0.5], [0.5], tmp_path / 'losses.png') is None
  assert not (tmp_path / 'losses.png').exists()


def test_demo_says_how_to_get_the_plot_and_goes_on(tmp_path, monkeypatch, capsys):
  from linen_nnx_cli.demo import run_demo
  from kit_mlp.description import ModelDescription

  monkeypatch.setitem(sys.modules, 'matplotlib', None)
  desc = ModelDescription(num_layers=1, depth=32, batch=8)
  assert run_demo(desc, steps=2, plot=str(tmp_path / 'demo.png')) == 0
  out = capsys.readouterr().out
  assert "No loss plot: matplotlib is not installed. To get it: pip install -e '.[plot]'" in out
  assert 'CPU 0,4' in out  # the device grid of one weight on each side
