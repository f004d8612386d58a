"""Tests of `converters.distributed` within one process (the multi-process ones
are in `tests/multiprocess`)."""

from __future__ import annotations

import pytest

from converters import distributed as processes


def test_one_process_exchanges_its_own_value_and_agrees():
  assert processes.exchange('x', {'a': 1}) == [{'a': 1}]
  processes.agree('x', {'a': 1})  # nothing to disagree with
  processes.report_failure('nothing to tell')  # no-op


def test_differences_name_every_field_with_both_values():
  a = {'layout': 'scan', 'leaves': {'w': [[2, 3], 'float32']}, 'mesh': [2, 4]}
  b = {'layout': 'loop', 'leaves': {'w': [[2, 3], 'float32'], 'v': [[1], 'int32']}, 'mesh': [2, 4]}
  assert processes._differences(a, b) == [
      "layout: 'scan' vs 'loop'",
      'leaves/v (only in process B)',
  ]


def test_a_leaf_only_one_process_holds_is_named_with_the_process(monkeypatch):
  """What `agree` raises when process 1 holds another tree (tests/multiprocess
  runs it across processes; here process 1's value is given)."""
  mine = {'layout': 'scan', 'leaves': {'DotReluDot_0/Dense_0/kernel': [[8, 32], 'float32']}}
  theirs = {'layout': 'scan', 'leaves': {**mine['leaves'], 'DotReluDot_2/Dense_0/kernel': [[8, 32], 'float32']}}
  monkeypatch.setattr(processes, 'exchange', lambda label, value, timeout_s=None: [value, theirs])
  with pytest.raises(processes.ProcessMismatchError) as e:
    processes.agree('conversion', mine)
  assert 'process 1 differs from process 0 in leaves/DotReluDot_2/Dense_0/kernel (only in process 1)' in str(e.value)
  assert 'give every process the same arguments and the same trees' in str(e.value)
