"""Tests of `converters.distributed` within one process (the multi-process ones
are in `tests/multiprocess`)."""

from __future__ import annotations

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
