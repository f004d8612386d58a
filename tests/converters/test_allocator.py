"""Tests of `converters.allocator`: freed host memory goes back to the system."""

from __future__ import annotations

import ctypes.util
import os
import platform
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


def test_without_glibc_it_does_nothing(monkeypatch):
  monkeypatch.setattr(ctypes.util, 'find_library', lambda name: None)
  allocator._malloc_trim.cache_clear()
  try:
    assert allocator.release_free_memory() is False
  finally:
    allocator._malloc_trim.cache_clear()
