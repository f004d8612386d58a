"""Handing host memory that Orbax and TensorStore freed back to the system.

Restoring and saving a checkpoint allocate a temporary host buffer per shard,
typically some hundred KiB each, from many threads. glibc keeps freed blocks of
that size in its per-thread arenas instead of returning them, so each stage of
a conversion (read, write, read back) would stack its temporaries on top of
what the previous stage left behind. `release_free_memory` asks glibc to return
every free page (`malloc_trim`); with any other C library it does nothing.

`recycle_large_buffers` is the other half, for a process that owns its
allocator (the `linen-nnx` command calls it at start-up; the library never
does): glibc then serves buffers of every size from its heap and reuses them,
instead of mapping fresh pages for each large one and paying a page fault per
4 KiB written. It changes the whole process, so it is a choice for a program's
entry point, like `GLIBC_TUNABLES`, which it replaces.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ['recycle_large_buffers']


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


@functools.cache
def _glibc():
  """The C library, if it is glibc (the one these calls mean what they say in)."""
  name = ctypes.util.find_library('c')
  if name is None:
    return None
  try:
    libc = ctypes.CDLL(name)
  except OSError:
    return None
  return libc if hasattr(libc, 'gnu_get_libc_version') else None


@functools.cache
def _malloc_trim():
  return getattr(_glibc(), 'malloc_trim', None)


def recycle_large_buffers() -> bool:
  """Makes glibc keep freed buffers of every size for reuse; whether it could.

  Process-wide and irreversible: for a program's start-up, not a library.
  Large buffers (a stacked layer's shard, a checkpoint chunk) then come from
  the heap, as small ones do, instead of fresh mappings (`M_MMAP_MAX` 0, which,
  unlike `M_MMAP_THRESHOLD`, has no 32 MiB cap); one arena, which alone grows
  without bound; and freed memory is not trimmed on every free
  (`release_free_memory` still returns it between stages). The same as
  `GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=...`.
  """
  libc = _glibc()
  if libc is None:
    return False
  mallopt = libc.mallopt
  mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
  return all(mallopt(parameter, value) == 1 for parameter, value in settings)


def release_free_memory() -> bool:
  """Returns free heap pages to the system; whether the C library could."""
  trim = _malloc_trim()
  if trim is None:
    return False
  trim(0)
  return True
