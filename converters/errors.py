"""The conversion error family.

Every error the converters raise is a `ConversionError`. Its message names the
parameter path (or every offending path), what was expected, what was found and
how to fix it. Subclasses let callers (and the fuzz tests) tell cases apart.
No conversion ever returns a partial result: errors are raised before any
output is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable


class ConversionError(ValueError):
  """A tree that cannot be converted as asked.

  Attributes:
    paths: every offending path.
    problem: what is wrong (the message without `fix`).
    fix: how to fix it, when it is said apart from the problem.
  """

  def __init__(self, message: str, paths: Iterable[str] = (), *, fix: str | None = None):
    super().__init__(message if fix is None else f'{message}; {fix}')
    self.paths = tuple(paths)
    self.problem = message
    self.fix = fix


class PathMappingError(ConversionError):
  """Paths that no rule maps, that several rules map, or that collide."""


class DisagreementError(PathMappingError):
  """Variables paired by the structure of the two computations (and the
  rules given or tried), but the models disagree when run through that
  pairing: the port computes otherwise."""


class UndecidedError(PathMappingError):
  """Variables the structure of the two computations pairs only by a
  position (in a stack, a selection, a branch) or cannot tell apart, which
  running the models on the example inputs cannot decide either: example
  inputs that use each of them, or their rules, decide them."""


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


class LeafErrors:
  """The errors of one check over many leaves, raised together.

  A check that stops at its first offending leaf makes a user fix a model one
  parameter at a time; this one lets every leaf be checked first:

    errors = LeafErrors()
    for path in paths:
      with errors.leaf():
        check(path)
    errors.raise_any()

  `raise_any` raises nothing when every leaf passed, the error itself when
  one failed, and otherwise one error of the first failure's class whose
  message lists every failing leaf's problem (up to `limit`) and each
  distinct fix once.
  """

  def __init__(self, limit: int = 50):
    self.errors: list[ConversionError] = []
    self.limit = limit

  @contextlib.contextmanager
  def leaf(self):
    try:
      yield
    except ConversionError as e:
      self.errors.append(e)

  def __bool__(self) -> bool:
    return bool(self.errors)

  def raise_any(self) -> None:
    if not self.errors:
      return
    if len(self.errors) == 1:
      raise self.errors[0]
    problems = [e.problem for e in self.errors]
    shown = '; '.join(problems[:self.limit])
    if len(problems) > self.limit:
      shown += f'; ... ({len(problems) - self.limit} more)'
    fixes = list(dict.fromkeys(e.fix for e in self.errors if e.fix))
    paths = [p for e in self.errors for p in e.paths]
    raise type(self.errors[0])(
        f'{len(self.errors)} leaves do not fit the target: {shown}',
        paths,
        fix='; '.join(fixes) or None,
    )


class CheckpointError(ConversionError):
  """A checkpoint that is missing, corrupted or of unknown structure, or a
  destination that cannot be written."""


class VerificationError(ConversionError):
  """What was written differs from what was converted, or two trees differ."""
