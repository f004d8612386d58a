"""Tests of `linen_nnx_cli.progress`: a rich bar on a terminal, a line per stage and a heartbeat in logs."""

from __future__ import annotations

import io
import time

import pytest

from linen_nnx_cli.progress import Progress

STAGES = ['reading', 'converting', 'writing']


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_in_a_log_each_stage_gets_a_line_and_a_long_stage_a_heartbeat():
  log = io.StringIO()
  with Progress(STAGES, stream=log, interval=0.05) as progress:
    progress.stage('reading')
    progress.stage('converting')
    time.sleep(0.3)
    progress.stage('writing')
  lines = log.getvalue().splitlines()
  assert lines[:2] == ['linen-nnx: [1/3] reading', 'linen-nnx: [2/3] converting']
  assert lines[-1] == 'linen-nnx: [3/3] writing'
  heartbeats = lines[2:-1]
  assert heartbeats and all(l.startswith('linen-nnx: [2/3] converting: ') and l.endswith(' s') for l in heartbeats)
  assert list(progress.timings) == STAGES and progress.timings['converting'] >= 0.3


def test_on_a_terminal_rich_draws_a_bar_and_no_log_lines():
  terminal = Terminal()
  with Progress(STAGES, stream=terminal, interval=0.05) as progress:
    assert progress.tty
    for stage in STAGES:
      progress.stage(stage)
  screen = terminal.getvalue()
  assert 'linen-nnx: [' not in screen
  assert '3/3' in screen and 'writing' in screen  # the final frame: every stage done
  assert list(progress.timings) == STAGES


def test_disabled_progress_writes_nothing_and_still_times_stages():
  log = io.StringIO()
  with Progress(STAGES, stream=log, enabled=False) as progress:
    progress.stage('reading')
  assert log.getvalue() == '' and list(progress.timings) == ['reading']


def test_an_unknown_stage_is_refused():
  with Progress(STAGES, stream=io.StringIO(), enabled=False) as progress:
    with pytest.raises(ValueError, match="unknown stage 'saving'"):
      progress.stage('saving')
