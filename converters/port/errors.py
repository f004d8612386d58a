"""What the port refuses: a construct it cannot write (which becomes a stub),
an output it must not write (a file it reads), a model it cannot trace, and
a tool it cannot run."""

from __future__ import annotations


class Untranslatable(Exception):
  """A construct the port cannot write: the class, the line of the Linen
  source, and why (ending with what to do: port it by hand)."""

  def __init__(self, cls: type | None, line: int | None, message: str):
    self.cls, self.line = cls, line
    super().__init__(message)


class UntracedCreation(Untranslatable):
  """A module created where no traced configuration went (a loop the traced
  configuration runs no times, an `if` it does not take): written once a
  configuration that goes there is traced too."""


class PortOutputError(ValueError):
  """A file the port would write is one it reads, or in no directory."""


class PortInputError(ValueError):
  """The model cannot be traced on its example inputs (Linen's own `init`
  fails): nothing to port."""


#: How to install what `linen-nnx port` runs beside the kit (libcst, ruff).
PORT_INSTALL_HINT = "pip install -e '.[port]'  (the port extra: libcst and ruff)"


class PortToolError(RuntimeError):
  """A tool the port runs on what it writes (ruff) could not run: the file
  is written, but unchecked."""
