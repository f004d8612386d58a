"""Handing host memory that Orbax and TensorStore freed back to the system.

Restoring and saving a checkpoint allocate a temporary host buffer per shard,
typically some hundred KiB each, from many threads. glibc keeps freed blocks of
that size in its per-thread arenas instead of returning them, so each stage of
a conversion (read, write, read back) would stack its temporaries on top of
what the previous stage left behind. `release_free_memory` asks glibc to return
every free page (`malloc_trim`); with any other C library it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
  name = ctypes.util.find_library('c')
  if name is None:
    return None
  try:
    return getattr(ctypes.CDLL(name), 'malloc_trim', None)
  except OSError:
    return None


def release_free_memory() -> bool:
  """Returns free heap pages to the system; whether the C library could."""
  trim = _malloc_trim()
  if trim is None:
    return False
  trim(0)
  return True
