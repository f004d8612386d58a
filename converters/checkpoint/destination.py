"""Where a checkpoint conversion may write, decided on the paths the OS resolves.

`plan_destination` compares SRC and DST as the filesystem sees them: symlinks
anywhere in either path, `..` after a symlink, relative paths. DST names a
directory entry: its parent is resolved, its last component is kept, so
`--force` replaces a symlink at DST (never what it points to). Everything is
checked before anything is created: DST must not be SRC, lie inside SRC or
contain SRC (whether DST is followed through a symlink or not), its parent
must be a writable directory (or creatable), and an existing DST is replaced
only with `force` and only if it is a checkpoint, a file, a symlink or an empty
directory.

The conversion writes into a hidden sibling of DST (`.NAME.partial-PID`) and
moves a replaced DST aside to `.NAME.replaced-PID` for the instant between two
renames; `remove_stale` deletes those that dead runs left behind, never one that
is, holds or lies inside SRC, and never following a symlink. A DST that a dead
run moved aside and never replaced is put back before anything else happens.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil

from converters.checkpoint.inspect import is_checkpoint_directory
from converters.errors import CheckpointError

_KINDS = ('partial', 'replaced')


def _absolute(path: str) -> str:
  path = os.fspath(path)
  return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _real(path: str) -> str:
  """The path with every symlink and `..` resolved, as the OS would."""
  return os.path.realpath(_absolute(path))


def _identity(path: str) -> tuple[int, int] | None:
  """(device, inode) of an existing path, followed: one directory seen
  through two mounts (bind mounts, volumes) has one identity."""
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_dev, st.st_ino


def _ancestors(path: str) -> list[str]:
  """`path` and every directory above it, up to the root."""
  chain = [path]
  while os.path.dirname(chain[-1]) != chain[-1]:
    chain.append(os.path.dirname(chain[-1]))
  return chain


def _inside(path: str, directory: str) -> bool:
  """Whether `path` is `directory` or lies below it: by real path, or by
  the identity of an existing ancestor (another mount of the same place)."""
  if os.path.commonpath([path, directory]) == directory:
    return True
  target = _identity(directory)
  return target is not None and any(_identity(a) == target for a in _ancestors(path))


def overlaps(a: str, b: str) -> bool:
  """Whether one of two real paths is, or lies inside, the other."""
  return _inside(a, b) or _inside(b, a)


def _pid_alive(text: str) -> bool | None:
  """Whether the process of a leftover's PID suffix runs; None if not a PID."""
  if not text.isascii() or not text.isdigit():
    return None
  try:
    os.kill(int(text), 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  except (OverflowError, ValueError):
    return False  # no process can have it
  return True


def remove_entry(path: str) -> None:
  """Deletes a directory tree, a file or a symlink (the link itself, never its target)."""
  if os.path.islink(path) or not os.path.isdir(path):
    os.unlink(path)
  else:
    shutil.rmtree(path)


@dataclasses.dataclass(frozen=True)
class Destination:
  """A checked DST.

  Attributes:
    path: the DST entry: its parent's real path joined with its name.
    protected: the real paths of the source, which nothing may touch.
    exists: whether something (even a dangling symlink) is at `path`.
    force: whether an existing DST may be replaced.
  """

  path: str
  protected: tuple[str, ...]
  exists: bool
  force: bool = False

  @property
  def parent(self) -> str:
    return os.path.dirname(self.path)

  def sibling(self, kind: str, pid: int | str) -> str:
    """`.NAME.KIND-PID` beside DST: staging (`partial`) or a replaced DST."""
    return os.path.join(self.parent, f'.{os.path.basename(self.path)}.{kind}-{pid}')

  def missing_parents(self) -> list[str]:
    """DST's ancestors that do not exist yet, outermost first: what creating
    the staging directory creates, and a failed run removes again."""
    missing, parent = [], self.parent
    while parent and not os.path.lexists(parent):
      missing.append(parent)
      parent = os.path.dirname(parent)
    return missing[::-1]

  def make_staging(self, pid: int) -> str:
    """Creates the staging sibling (and DST's missing parents); returns it."""
    staging = self.sibling('partial', pid)
    try:
      os.makedirs(staging)
    except OSError as e:
      raise CheckpointError(
          f'{self.path}: cannot create the staging directory {staging} beside '
          f'it: {e.strerror or e}; choose a DST in a writable directory'
      ) from e
    return staging

  def leftovers(self, kind: str) -> list[str]:
    """The `kind` siblings that runs which are no longer alive left behind."""
    return sorted(
        path for path in glob.glob(glob.escape(self.sibling(kind, '')) + '*')
        if _pid_alive(path.rsplit('-', 1)[1]) is False
    )

  def remove_stale(self) -> list[str]:
    """Deletes the staging and replaced siblings of dead runs; returns them.

    Never removes one that is, holds or lies inside the source, and removes a
    symlink as a link. A replaced DST is only removed once a DST stands in
    its place (`plan_destination` puts it back otherwise).
    """
    removed = []
    for kind in _KINDS:
      if kind == 'replaced' and not os.path.lexists(self.path):
        continue
      for path in self.leftovers(kind):
        if any(_holds_or_lies_in(path, p) for p in self.protected):
          continue
        try:
          remove_entry(path)
        except OSError:
          continue  # a later run tries again; never fail a conversion for it
        removed.append(path)
    return removed


def _holds_or_lies_in(leftover: str, source: str) -> bool:
  """Whether removing `leftover` would touch `source`.

  A symlink is removed as a link, so only where the link lies matters, not
  where it points: it is never followed (an identity check would follow it).
  """
  if os.path.islink(leftover):
    return _inside(_real(os.path.dirname(leftover)), source)
  return overlaps(_real(leftover), source)


def _entry(dst: str) -> str:
  """The directory entry `dst` names: real parent + last component."""
  text = _absolute(dst).rstrip(os.sep) or os.sep
  head, name = os.path.split(text)
  if name in ('', '.', '..'):
    return _real(text)
  return os.path.join(_real(head), name)


def _check_parent(dst: str, parent: str) -> None:
  """The parent exists as a writable directory, or can be created."""
  existing = parent
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if os.path.islink(existing):  # realpath stopped at it: a loop
    raise CheckpointError(
        f'{dst}: cannot be created: {existing} is a symlink that does not resolve '
        '(a loop); choose another DST'
    )
  if not os.path.isdir(existing):
    raise CheckpointError(
        f'{dst}: cannot be created: {existing} is a file, not a directory; '
        'choose a DST whose parent is a directory'
    )
  if not os.access(existing, os.W_OK | os.X_OK):
    raise CheckpointError(
        f'{dst}: cannot be created: the directory {existing} is not writable; '
        'choose a DST in a writable directory'
    )


def _replaceable(path: str) -> bool:
  """A checkpoint and nothing else, a file, a symlink or an empty directory."""
  if os.path.islink(path) or not os.path.isdir(path):
    return True
  try:
    return is_checkpoint_directory(path, only=True)
  except OSError:
    return False


def check_replaceable(text: str, path: str) -> None:
  """Raises `CheckpointError` unless `--force` may replace what is at `path`."""
  if not _replaceable(path):
    raise CheckpointError(
        f'{text}: is a directory that holds something other than a checkpoint; '
        '--force only replaces a checkpoint, a file, a symlink or an empty '
        'directory, so remove it yourself or choose another DST',
        [text],
    )


def _recover(text: str, entry: str, protected: tuple[str, ...]) -> str | None:
  """Puts back a DST that a killed run had moved aside to replace it.

  Returns where it was, or None if DST stands or no run left one. Several
  are never guessed between (nor removed later): the user chooses. One that
  is, holds or lies inside the source is the user's input and stays put.
  """
  if os.path.lexists(entry):
    return None
  replaced = [
      path for path in Destination(entry, (), False).leftovers('replaced')
      if not any(_holds_or_lies_in(path, p) for p in protected)
  ]
  if len(replaced) > 1:
    raise CheckpointError(
        f'{text}: is missing and killed runs left {len(replaced)} earlier DSTs beside '
        f'it: {", ".join(replaced)}; rename the one to keep to {text} and remove the others',
        [text],
    )
  if not replaced:
    return None
  try:
    os.rename(replaced[0], entry)
  except OSError as e:
    raise CheckpointError(
        f'{text}: a killed run left the DST it was replacing beside it as {replaced[0]} '
        f'and it could not be put back: {e.strerror or e}; rename it to {text} yourself',
        [text],
    ) from e
  return replaced[0]


def _check_overlap(text: str, entry: str, spellings: set[str], protected) -> None:
  for source in protected:
    for spelling in sorted(spellings):
      if overlaps(spelling, source):
        how = 'is' if _inside(spelling, source) and _inside(source, spelling) else (
            'lies inside' if _inside(spelling, source) else 'contains'
        )
        shown = text if spelling == entry else f'{text} (-> {spelling})'
        raise CheckpointError(
            f'{shown}: {how} the source {source}; SRC is never written to, so '
            'write the converted checkpoint outside it',
            [text],
        )


def plan_destination(src_paths: list[str], dst: str | os.PathLike, force: bool) -> Destination:
  """Checks DST against the source paths before anything is created.

  Args:
    src_paths: the source as given and the checkpoint found in it (they
      differ for a `flax.training.checkpoints` directory).
    dst: DST as given (relative, through symlinks, with `..`).
    force: whether an existing DST may be replaced.

  Raises:
    CheckpointError: DST overlaps the source, cannot be created, exists
      without `force`, or exists as something `force` does not replace.
  """
  text = os.fspath(dst)
  if not text:
    raise CheckpointError('DST is empty; give the path to write the converted checkpoint to')
  for given in [text, *map(os.fspath, src_paths)]:
    try:
      given.encode('utf-8')
    except UnicodeEncodeError:
      raise CheckpointError(
          f'{given!r}: is not valid UTF-8, which checkpoint storage needs; rename it',
          [given],
      ) from None
  try:
    entry = _entry(text)
    protected = tuple(dict.fromkeys(_real(p) for p in src_paths))
  except FileNotFoundError:  # os.getcwd() of a deleted working directory
    raise CheckpointError(
        f'{text}: the working directory no longer exists; give absolute paths or '
        'change to an existing directory'
    ) from None
  if entry == os.sep:
    raise CheckpointError(f'{text}: is the filesystem root; choose a new directory as DST')
  _check_overlap(text, entry, {entry}, protected)
  recovered = _recover(text, entry, protected)  # only now that DST is known to lie outside SRC
  exists = os.path.lexists(entry)
  if exists:  # what DST points to, if it is a symlink
    _check_overlap(text, entry, {_real(entry)}, protected)
  _check_parent(text, os.path.dirname(entry))
  if exists and not force:
    how = f' (put back from {recovered}, where a killed run had moved it aside)' if recovered else ''
    raise CheckpointError(f'{text}: already exists{how}; pass --force to replace it', [text])
  if exists:
    check_replaceable(text, entry)
  return Destination(entry, protected, exists, force)
