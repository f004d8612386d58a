"""Progress of long command-line work: a bar on a terminal, lines otherwise.

`Progress` walks through named stages. On a terminal it redraws one line
(`[#####.....] 2/5 writing  12.3 s`) a few times a second; when the stream is
not a terminal (CI logs, pipes) it prints a line when a stage starts and then
one every `interval` seconds while the stage lasts, so a log never goes quiet
for long and tests can follow the stages. It writes to stderr by default, so
`--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

_WIDTH = 20


class Progress:
  """Stage-by-stage progress; use as a context manager."""

  def __init__(
      self,
      stages: list[str],
      stream: TextIO | None = None,
      interval: float = 10.0,
      enabled: bool = True,
  ):
    self.stages = list(stages)
    self.stream = stream if stream is not None else sys.stderr
    self.interval = interval
    self.enabled = enabled
    self.tty = enabled and bool(getattr(self.stream, 'isatty', lambda: False)())
    self.timings: dict[str, float] = {}
    self._stage: str | None = None
    self._started = 0.0
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def __enter__(self) -> Progress:
    if self.enabled:
      self._thread = threading.Thread(target=self._tick, daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._finish_stage()
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self.tty:
      self.stream.write('\n')
      self.stream.flush()

  def stage(self, name: str) -> None:
    """Ends the current stage (recording its time) and starts `name`."""
    if name not in self.stages:
      raise ValueError(f'unknown stage {name!r}; stages are {self.stages}')
    with self._lock:
      self._finish_stage()
      self._stage, self._started = name, time.perf_counter()
      self._draw(new_stage=True)

  def _finish_stage(self) -> None:
    if self._stage is not None:
      self.timings[self._stage] = time.perf_counter() - self._started
      self._stage = None

  def _tick(self) -> None:
    period = 0.2 if self.tty else self.interval
    while not self._stop.wait(period):
      with self._lock:
        if self._stage is not None:
          self._draw(new_stage=False)

  def _draw(self, new_stage: bool) -> None:
    if not self.enabled or self._stage is None:
      return
    index = self.stages.index(self._stage)
    elapsed = time.perf_counter() - self._started
    count = f'{index + 1}/{len(self.stages)}'
    if self.tty:
      done = _WIDTH * index // len(self.stages)
      bar = '#' * done + '.' * (_WIDTH - done)
      self.stream.write(f'\r[{bar}] {count} {self._stage:<12} {elapsed:6.1f} s')
    elif new_stage:
      self.stream.write(f'linen-nnx: [{count}] {self._stage}\n')
    else:
      self.stream.write(f'linen-nnx: [{count}] {self._stage}: {elapsed:.0f} s\n')
    self.stream.flush()
