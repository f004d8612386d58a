"""The relayout operations: how one target array is made from its sources.

A plan (`planning.Target`), the record of a dry run
(`provenance.Derivation`) and a checkpoint recipe
(`checkpoint.recipes.Made`) each say how an array is made from others with
one of these, followed by a rule's value transform where it has one:

- `Keep`: the input as it is (before a transform: every part as it is);
- `Stack`: the inputs stacked on a new leading axis in layer order (with a
  transform that fuses parts: part after part, each a run of layers);
- `Slice`: layer `index` of each input, along its leading axis;
- `Cast`: the one input (a scalar: a step, a count) as `dtype`.

`values` makes what an operation hands to a transform (or its result, with
none), on device (`jnp`) or on the host (`np`); `reads` maps a region of the
result to the regions of the inputs it is read from, and `assemble` puts
those pieces together: the conversion in memory (`converters.execution`)
and from disk, chunk by chunk (`converters.checkpoint.streaming`), follow
these three and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Union

import numpy as np

#: `((start, stop), ...)`: a box of an array, one interval per dimension.
Region = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Keep:
  """The input as it is."""

  def values(self, arrays: Sequence[Any], parts: int, xp=np) -> list:
    return list(arrays)

  def reads(self, region: Region) -> list[tuple[int, Region]]:
    return [(0, region)]

  def assemble(self, pieces: Sequence[np.ndarray], region: Region, dtype) -> np.ndarray:
    return pieces[0]


@dataclasses.dataclass(frozen=True)
class Stack:
  """The inputs stacked on a new leading axis, in layer order."""

  def values(self, arrays: Sequence[Any], parts: int, xp=np) -> list:
    layers = len(arrays) // parts  # part after part, each a run of layers
    return [xp.stack(list(arrays[p * layers:(p + 1) * layers])) for p in range(parts)]

  def reads(self, region: Region) -> list[tuple[int, Region]]:
    return [(layer, region[1:]) for layer in range(*region[0])]

  def assemble(self, pieces: Sequence[np.ndarray], region: Region, dtype) -> np.ndarray:
    if not pieces:
      return np.zeros((0,) + tuple(b - a for a, b in region[1:]), dtype)
    return np.stack(pieces)


@dataclasses.dataclass(frozen=True)
class Slice:
  """Layer `index` of each input, along its leading axis."""

  index: int

  def values(self, arrays: Sequence[Any], parts: int, xp=np) -> list:
    return [x[self.index] for x in arrays]

  def reads(self, region: Region) -> list[tuple[int, Region]]:
    return [(0, ((self.index, self.index + 1),) + region)]

  def assemble(self, pieces: Sequence[np.ndarray], region: Region, dtype) -> np.ndarray:
    return pieces[0][0]


@dataclasses.dataclass(frozen=True)
class Cast:
  """The one input as `dtype`."""

  dtype: np.dtype

  def values(self, arrays: Sequence[Any], parts: int, xp=np) -> list:
    return [arrays[0].astype(self.dtype)]

  def reads(self, region: Region) -> list[tuple[int, Region]]:
    return [(0, region)]

  def assemble(self, pieces: Sequence[np.ndarray], region: Region, dtype) -> np.ndarray:
    return pieces[0].astype(self.dtype)


Operation = Union[Keep, Stack, Slice, Cast]
