"""Tests of `converters.allocator`: freed host memory goes back to the system,
and a program can have glibc recycle large buffers instead."""

from __future__ import annotations

import ctypes.util
import os
import platform
import subprocess
import sys
import threading

import numpy as np
import pytest

from converters import allocator


def _rss() -> int:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


@pytest.mark.skipif(platform.libc_ver()[0] != 'glibc', reason='glibc behaviour')
def test_blocks_freed_in_a_thread_arena_are_returned():
  kept = []

  def shard_sized_temporaries():
    np.ones(4 * 2**20, np.uint8)  # freeing it raises glibc's mmap threshold
    blocks = [np.ones(256 * 2**10, np.uint8) for _ in range(256)]  # 64 MiB
    kept.append(blocks[-1])  # the arena's top stays in use: no automatic trim

  before = _rss()
  thread = threading.Thread(target=shard_sized_temporaries)
  thread.start()
  thread.join()
  retained = _rss() - before
  assert retained >= 32 * 2**20  # what glibc keeps without being asked
  assert allocator.release_free_memory()
  assert _rss() - before < retained - 32 * 2**20


_LARGE_BUFFERS = """
import resource, sys
import numpy as np
from converters import allocator

def faults_of_large_buffers():
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(8):
    np.ones(64 * 2**20, np.uint8)  # a stacked shard's size, freed at once
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults_of_large_buffers()
default = faults_of_large_buffers()
recycling = allocator.recycle_large_buffers()
faults_of_large_buffers()  # the heap grows to hold one
print(default, faults_of_large_buffers(), recycling)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != 'glibc', reason='glibc behaviour')
def test_recycled_large_buffers_are_reused_not_mapped_afresh():
  # In a process of its own: the setting is process-wide and cannot be undone.
  out = subprocess.run(
      [sys.executable, '-c', _LARGE_BUFFERS], check=True, capture_output=True, text=True,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  ).stdout.split()
  default, recycled, recycling = int(out[0]), int(out[1]), out[2]
  assert recycling == 'True'
  assert default >= 8 * 16  # fresh pages every time (16 huge pages a buffer at least)
  assert recycled * 8 < default


def test_without_glibc_it_does_nothing(monkeypatch):
  monkeypatch.setattr(ctypes.util, 'find_library', lambda name: None)
  allocator._glibc.cache_clear()
  allocator._malloc_trim.cache_clear()
  try:
    assert allocator.release_free_memory() is False
    assert allocator.recycle_large_buffers() is False
  finally:
    allocator._glibc.cache_clear()
    allocator._malloc_trim.cache_clear()
