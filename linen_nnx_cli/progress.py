"""Progress of long command-line work: rich's live bar on a terminal, lines in logs.

`Progress` walks through named stages. On a terminal it is a
`rich.progress.Progress` bar (stage count, stage name, elapsed time) redrawn in
place; when the stream is not a terminal (CI logs, pipes) it prints a line when
a stage starts and then one every `interval` seconds while the stage lasts
(`linen-nnx: [2/5] converting: 20 s`), so a log never goes quiet for long and
tests can follow the stages. It writes to stderr by default, so `--json`
output on stdout stays machine-readable.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

import rich.progress
from rich.console import Console


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
    console = Console(file=self.stream)
    self.tty = enabled and console.is_terminal
    self.timings: dict[str, float] = {}
    self._stage: str | None = None
    self._started = 0.0
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._heartbeat: threading.Thread | None = None
    self._bar: rich.progress.Progress | None = None
    if self.tty:
      self._bar = rich.progress.Progress(
          rich.progress.BarColumn(),
          rich.progress.MofNCompleteColumn(),
          rich.progress.TextColumn('{task.description}'),
          rich.progress.TimeElapsedColumn(),
          console=console,
          transient=False,
      )
      self._task = self._bar.add_task('', total=len(self.stages), start=False)

  def __enter__(self) -> Progress:
    if self._bar is not None:
      self._bar.start()
    elif self.enabled:
      self._heartbeat = threading.Thread(target=self._beat, daemon=True)
      self._heartbeat.start()
    return self

  def __exit__(self, *exc) -> None:
    with self._lock:
      self._finish_stage()
    self._stop.set()
    if self._heartbeat is not None:
      self._heartbeat.join()
    if self._bar is not None:
      self._bar.stop()

  def stage(self, name: str) -> None:
    """Ends the current stage (recording its time) and starts `name`."""
    if name not in self.stages:
      raise ValueError(f'unknown stage {name!r}; stages are {self.stages}')
    with self._lock:
      self._finish_stage()
      self._stage, self._started = name, time.perf_counter()
      index = self.stages.index(name)
      if self._bar is not None:
        self._bar.start_task(self._task)
        self._bar.update(self._task, completed=index, description=name)
      elif self.enabled:
        self._line(f'[{index + 1}/{len(self.stages)}] {name}')

  def _finish_stage(self) -> None:
    if self._stage is not None:
      self.timings[self._stage] = time.perf_counter() - self._started
      if self._bar is not None:
        self._bar.update(self._task, completed=self.stages.index(self._stage) + 1)
      self._stage = None

  def _beat(self) -> None:
    while not self._stop.wait(self.interval):
      with self._lock:
        if self._stage is not None:
          index = self.stages.index(self._stage)
          elapsed = time.perf_counter() - self._started
          self._line(f'[{index + 1}/{len(self.stages)}] {self._stage}: {elapsed:.0f} s')

  def _line(self, text: str) -> None:
    self.stream.write(f'linen-nnx: {text}\n')
    self.stream.flush()
