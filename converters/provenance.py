"""What each leaf of an abstract conversion is made of, recorded during a dry run.

A conversion of abstract arrays (`jax.ShapeDtypeStruct`s) checks everything
and computes nothing: a leaf whose layout is kept is the input leaf itself,
and a leaf that would be computed (a stack of layers, one layer's slice, a
reshaped or fused parameter, a counter of another dtype) is a new abstract
leaf. Inside `recording()`, every such new leaf is recorded with how it would
be made from its inputs (`Derivation`), so that a checkpoint can be converted
array by array from disk (`converters.checkpoint.streaming`) by exactly the
plan the in-memory conversion follows, without the conversion knowing about
files. Outside `recording()`, nothing is recorded and nothing changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

from converters import relayout_ops


@dataclasses.dataclass(frozen=True, eq=False)
class Derivation:
  """How one abstract leaf would be made from its inputs.

  Attributes:
    op: the relayout operation (`converters.relayout_ops`): `Stack` (the
      inputs, in layer order, part after part when a transform fuses
      parts), `Slice` (one layer of each input), `Keep` (the inputs as they
      are, before a transform) or `Cast` (the one input, a scalar, as
      another dtype).
    inputs: the abstract leaves it is made from.
    transform: applied to the list of (stacked, sliced or kept) inputs, or
      None (`converters.transforms.Step`).
  """

  op: relayout_ops.Operation
  inputs: tuple[Any, ...]
  transform: Any = None


class Recorder:
  """The derivations recorded so far, by the identity of the leaf made."""

  def __init__(self):
    self._made: dict[int, tuple[Any, Derivation]] = {}

  def add(self, value: Any, derivation: Derivation) -> None:
    self._made[id(value)] = (value, derivation)  # the value is held: its id stays unique

  def derivation(self, value: Any) -> Derivation | None:
    """How `value` was made, or None if it was not made during the recording."""
    made = self._made.get(id(value))
    return None if made is None or made[0] is not value else made[1]


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    'converters.provenance', default=None
)


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
  """Records the derivation of every abstract leaf made inside the block."""
  recorder = Recorder()
  token = _RECORDER.set(recorder)
  try:
    yield recorder
  finally:
    _RECORDER.reset(token)


def record(value: Any, derivation: Derivation) -> Any:
  """`value`, with its derivation recorded when a recording is running."""
  recorder = _RECORDER.get()
  if recorder is not None:
    recorder.add(value, derivation)
  return value
