"""The conversion error family.

Every error the converters raise is a `ConversionError`. Its message names the
parameter path (or every offending path), what was expected, what was found and
how to fix it. Subclasses let callers (and the fuzz tests) tell cases apart.
No conversion ever returns a partial result: errors are raised before any
output is built.
"""

from __future__ import annotations

from collections.abc import Iterable


class ConversionError(ValueError):
  """A tree that cannot be converted as asked."""

  def __init__(self, message: str, paths: Iterable[str] = ()):
    super().__init__(message)
    self.paths = tuple(paths)


class PathMappingError(ConversionError):
  """Paths that no rule maps, that several rules map, or that collide."""


class StructureError(ConversionError):
  """Parameters missing from, or unexpected in, the source or the target."""


class ShapeError(ConversionError):
  """A shape or dtype differs from what the target expects."""


class AnnotationError(ConversionError):
  """Sharding metadata that cannot describe its array on its mesh."""


class LayoutError(ConversionError):
  """A scanned <-> looped relayout that the layers do not allow."""


class OptimizerStateError(ConversionError):
  """An optimizer state whose structure the converters do not know."""


def format_offenders(paths: Iterable[str], limit: int = 50) -> str:
  """`a, b, c` with every offender listed (up to `limit`, then a count)."""
  paths = list(paths)
  shown = ', '.join(paths[:limit])
  if len(paths) > limit:
    shown += f', ... ({len(paths) - limit} more)'
  return shown


class CheckpointError(ConversionError):
  """A checkpoint that is missing, corrupted or of unknown structure, or a
  destination that cannot be written."""


class VerificationError(ConversionError):
  """What was written differs from what was converted, or two trees differ."""
