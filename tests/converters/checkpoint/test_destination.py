"""Tests of `converters.checkpoint.destination`: SRC is never written, however paths are spelled.

The unit tests pin each SRC/DST relation on resolved paths; the property runs
`linen-nnx convert` on random path situations (symlinks to SRC, its parents and
children, `..` after a symlink, relative spellings, files, directories and
dangling links at DST, leftovers of killed runs) and checks after every run
that SRC's bytes are unchanged, the exit code and JSON are as documented, no
staging or replaced sibling is left, and DST is absent, unchanged or a
verified checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from converters.checkpoint import destination
from converters.checkpoint import inspect as checkpoints
from converters.checkpoint.destination import plan_destination
from converters.errors import CheckpointError
from tests.converters.checkpoint.fixtures import tree_checksum, write_checkpoint
from tests.linen_nnx_cli.runner import assert_refused, run


def dead_pid() -> int:
  """The pid of a process that has exited (and been reaped)."""
  process = subprocess.Popen([sys.executable, '-c', 'pass'])
  process.wait()
  return process.pid


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  """A small Linen checkpoint, copied into each test's own folder."""
  path = tmp_path_factory.mktemp('saved') / 'ckpt'
  write_checkpoint(path, 'linen')
  return path


@contextlib.contextmanager
def cwd(path):
  before = os.getcwd()
  os.chdir(path)
  try:
    yield
  finally:
    os.chdir(before)


def world(root, saved):
  """`root/ckpt` (SRC) beside links into, onto and above it, and other entries."""
  shutil.copytree(saved, root / 'ckpt')
  (root / 'other').mkdir()
  (root / 'other' / 'keep.txt').write_text('not yours')
  os.symlink('ckpt', root / 'ckpt_link')  # SRC itself
  os.symlink('ckpt/d', root / 'inner_link')  # a directory inside SRC
  os.symlink('.', root / 'root_link')  # SRC's parent
  os.symlink('other', root / 'other_link')
  os.symlink('nowhere', root / 'dangling')
  (root / 'afile').write_text('a file')
  (root / 'empty').mkdir()
  shutil.copytree(saved, root / 'old_ckpt')


# -- plan_destination ------------------------------------------------------------------

# DST spellings that reach SRC, relative to `root`, with what the error says.
OVERLAPS = {
    'ckpt': 'is the source',
    'ckpt/new': 'lies inside the source',
    'ckpt_link': 'is the source',  # a symlink to SRC, replaced as a link or not
    'inner_link/new': 'lies inside the source',
    'inner_link/../new': 'lies inside the source',  # `..` after a symlink: inside SRC
    'root_link/ckpt': 'is the source',
    'root_link/ckpt/': 'is the source',
    'ckpt/d/..': 'is the source',
    '.': 'contains the source',
    'root_link': 'contains the source',
    'inner_link': 'lies inside the source',  # followed: a directory of SRC
}


@pytest.mark.parametrize('dst', OVERLAPS)
@pytest.mark.parametrize('src', ['ckpt', 'ckpt_link', 'root_link/ckpt'])
def test_dst_reaching_src_by_any_spelling_is_refused_before_anything_exists(tmp_path, saved, src, dst):
  world(tmp_path, saved)
  before = sorted(os.listdir(tmp_path)), tree_checksum(tmp_path / 'ckpt')
  with cwd(tmp_path), pytest.raises(CheckpointError, match=OVERLAPS[dst]) as info:
    plan_destination([src, checkpoints.locate(src)[0]], dst, force=True)
  assert 'SRC is never written to' in str(info.value)
  assert (sorted(os.listdir(tmp_path)), tree_checksum(tmp_path / 'ckpt')) == before


def test_dst_inside_a_flax_checkpoints_directory_is_refused(tmp_path, saved):
  """SRC is the directory as given, not only the newest step found in it."""
  steps = tmp_path / 'steps'
  shutil.copytree(saved, steps / 'checkpoint_3')
  src = os.fspath(steps)
  with pytest.raises(CheckpointError, match='lies inside the source'):
    plan_destination([src, checkpoints.locate(src)[0]], steps / 'converted', force=False)


def test_dst_resolves_its_parent_but_keeps_its_own_name(tmp_path, saved):
  world(tmp_path, saved)
  with cwd(tmp_path):
    planned = plan_destination(['ckpt'], 'other_link', force=True)
    assert planned.path == os.path.join(os.path.realpath(tmp_path), 'other_link')
    assert planned.exists
    planned = plan_destination(['ckpt'], 'root_link/new', force=False)
    assert planned.path == os.path.join(os.path.realpath(tmp_path), 'new')
    assert not planned.exists


@pytest.mark.parametrize('dst, message', [
    ('afile/new', 'is a file, not a directory'),
    ('afile/deeper/new', 'is a file, not a directory'),
    ('other', 'already exists; pass --force'),
    ('dangling', 'already exists; pass --force'),
])
def test_dst_that_cannot_be_written_is_refused(tmp_path, saved, dst, message):
  world(tmp_path, saved)
  with cwd(tmp_path), pytest.raises(CheckpointError, match=message):
    plan_destination(['ckpt'], dst, force=False)


def test_force_replaces_only_what_can_be_rebuilt(tmp_path, saved):
  world(tmp_path, saved)
  with cwd(tmp_path):
    with pytest.raises(CheckpointError, match='holds something other than a checkpoint; --force only replaces'):
      plan_destination(['ckpt'], 'other', force=True)
    for replaceable in ('afile', 'empty', 'old_ckpt', 'other_link', 'dangling'):
      assert plan_destination(['ckpt'], replaceable, force=True).exists


def test_remove_stale_spares_live_runs_the_source_and_link_targets(tmp_path, saved):
  world(tmp_path, saved)
  stale_dir = tmp_path / f'.new.partial-{dead_pid()}'
  stale_dir.mkdir()
  stale_file = tmp_path / f'.new.replaced-{dead_pid()}'
  stale_file.write_text('half-replaced')
  stale_link = tmp_path / f'.new.replaced-{dead_pid()}'  # a link to SRC: removed as a link
  os.symlink('ckpt', stale_link)
  live = tmp_path / f'.new.partial-{os.getpid()}'
  live.mkdir()
  # A source that happens to be named like a leftover is never removed.
  source_like = tmp_path / f'.new.partial-{dead_pid()}'
  shutil.copytree(saved, source_like)
  shutil.copytree(saved, tmp_path / 'new')  # DST stands: the replaced ones are old
  before = tree_checksum(tmp_path / 'ckpt'), tree_checksum(source_like)
  with cwd(tmp_path):
    planned = plan_destination([os.fspath(source_like)], 'new', force=True)
    removed = planned.remove_stale()
  assert sorted(removed) == sorted(map(os.fspath, (stale_dir, stale_file, stale_link)))
  assert not os.path.lexists(stale_link) and live.is_dir()
  assert (tree_checksum(tmp_path / 'ckpt'), tree_checksum(source_like)) == before


def test_a_dst_that_a_killed_run_moved_aside_is_put_back_not_removed(tmp_path, saved):
  """Killed between its two renames, a run leaves DST only as `.DST.replaced-PID`."""
  world(tmp_path, saved)
  aside = tmp_path / f'.new.replaced-{dead_pid()}'
  shutil.copytree(saved, aside)
  before = tree_checksum(aside)
  with cwd(tmp_path):
    with pytest.raises(CheckpointError, match=r'already exists \(put back from .*\.new\.replaced-.*; pass --force'):
      plan_destination(['ckpt'], 'new', force=False)
  assert not os.path.lexists(aside) and tree_checksum(tmp_path / 'new') == before


def test_several_dsts_moved_aside_are_never_guessed_between(tmp_path, saved):
  world(tmp_path, saved)
  asides = [tmp_path / f'.new.replaced-{dead_pid()}' for _ in range(2)]
  shutil.copytree(saved, asides[0])
  asides[1].write_text('an older DST')
  before = snapshot(tmp_path)
  with cwd(tmp_path):
    for force in (False, True):
      with pytest.raises(CheckpointError, match='killed runs left 2 earlier DSTs') as raised:
        plan_destination(['ckpt'], 'new', force=force)
      assert all(os.fspath(a) in str(raised.value) for a in asides)
  assert snapshot(tmp_path) == before


def test_a_moved_aside_dst_given_as_the_source_stays_put(tmp_path, saved):
  world(tmp_path, saved)
  aside = tmp_path / f'.new.replaced-{dead_pid()}'
  shutil.copytree(saved, aside)
  before = tree_checksum(aside)
  with cwd(tmp_path):
    planned = plan_destination([aside.name], 'new', force=False)
    assert not planned.exists and planned.remove_stale() == []
  assert not os.path.lexists(tmp_path / 'new') and tree_checksum(aside) == before


def test_a_dead_runs_link_to_the_source_is_removed_as_a_link(tmp_path, saved):
  world(tmp_path, saved)
  link = tmp_path / f'.new.partial-{dead_pid()}'
  os.symlink(tmp_path / 'ckpt', link)
  before = tree_checksum(tmp_path / 'ckpt')
  with cwd(tmp_path):
    removed = plan_destination(['ckpt'], 'new', force=False).remove_stale()
  assert removed == [os.fspath(link)] and not os.path.lexists(link)
  assert tree_checksum(tmp_path / 'ckpt') == before


@pytest.mark.parametrize('pid', ['2147483648', '99999999999999999999', '²', '１２', 'x'])
def test_leftovers_with_odd_pid_suffixes_never_fail_a_run(tmp_path, saved, pid):
  world(tmp_path, saved)
  odd = tmp_path / f'.new.partial-{pid}'
  odd.mkdir()
  with cwd(tmp_path):
    planned = plan_destination(['ckpt'], 'new', force=False)
    removed = planned.remove_stale()
  too_large = pid.isascii() and pid.isdigit()  # no process can have it: a dead run's
  assert removed == ([os.fspath(odd)] if too_large else [])


def test_force_never_replaces_a_directory_with_more_than_a_checkpoint(tmp_path, saved):
  world(tmp_path, saved)
  project = tmp_path / 'project'
  (project / 'checkpoint_1').mkdir(parents=True)
  (project / 'thesis.tex').write_text('years of work')
  shutil.copytree(saved, tmp_path / 'ckpt_plus')
  (tmp_path / 'ckpt_plus' / 'notes.txt').write_text('mine')
  with cwd(tmp_path):
    for dst in ('project', 'ckpt_plus'):
      with pytest.raises(CheckpointError, match='holds something other than a checkpoint'):
        plan_destination(['ckpt'], dst, force=True)


def test_dst_appearing_during_the_run_is_never_replaced_without_force(tmp_path, saved, monkeypatch):
  from converters.checkpoint import streaming

  world(tmp_path, saved)
  verify = streaming.verify

  def verify_then_someone_writes_dst(*args, **kwargs):
    result = verify(*args, **kwargs)
    (tmp_path / 'new').mkdir()
    (tmp_path / 'new' / 'keep.txt').write_text('written meanwhile')
    return result

  monkeypatch.setattr(streaming, 'verify', verify_then_someone_writes_dst)
  result = run('convert', tmp_path / 'ckpt', tmp_path / 'new', '--to', 'nnx', '--json')
  assert_refused(result, 'appeared while converting')
  assert os.listdir(tmp_path / 'new') == ['keep.txt']
  assert not [e for e in os.listdir(tmp_path) if '.partial-' in e]


def test_dst_reached_through_another_mount_of_src_is_refused(tmp_path, saved):
  """A bind mount shows one directory under two real paths: identity decides."""
  world(tmp_path, saved)
  alias = tmp_path / 'alias'
  alias.mkdir()
  mounted = subprocess.run(['mount', '--bind', os.fspath(tmp_path), os.fspath(alias)], capture_output=True)
  if mounted.returncode != 0:
    pytest.skip(f'bind mounts need privileges here: {mounted.stderr.decode().strip()}')
  try:
    for dst in ('alias/ckpt', 'alias/ckpt/new'):
      with cwd(tmp_path), pytest.raises(CheckpointError, match='the source'):
        plan_destination(['ckpt'], dst, force=True)
  finally:
    subprocess.run(['umount', os.fspath(alias)], check=True)


def test_staging_that_cannot_be_created_is_a_checkpoint_error(tmp_path, saved, monkeypatch):
  world(tmp_path, saved)
  with cwd(tmp_path):
    planned = plan_destination(['ckpt'], 'new', force=False)

  def refuse(path, *args, **kwargs):
    raise PermissionError(13, 'Permission denied', path)

  monkeypatch.setattr(destination.os, 'makedirs', refuse)
  with pytest.raises(CheckpointError, match='cannot create the staging directory .* Permission denied'):
    planned.make_staging(os.getpid())


# -- the command line ---------------------------------------------------------------


def test_cli_symlinked_src_onto_itself_with_force_exits_2_and_keeps_src(tmp_path, saved):
  world(tmp_path, saved)
  before = tree_checksum(tmp_path / 'ckpt')
  result = run('convert', tmp_path / 'ckpt_link', tmp_path / 'ckpt', '--to', 'nnx', '--force', '--json')
  assert_refused(result, 'is the source')
  result = run('convert', tmp_path / 'ckpt', tmp_path / 'inner_link' / 'converted', '--to', 'nnx', '--json')
  assert_refused(result, 'lies inside the source')
  assert tree_checksum(tmp_path / 'ckpt') == before
  assert checkpoints.inspect(tmp_path / 'ckpt').framework == 'linen'


@pytest.mark.parametrize('target', ['afile', 'other_link', 'dangling', 'empty', 'old_ckpt'])
def test_cli_force_replaces_a_file_link_or_checkpoint_and_leaves_nothing_behind(tmp_path, saved, target):
  world(tmp_path, saved)
  os.symlink('other', tmp_path / f'.{target}.replaced-{dead_pid()}')  # a killed run's leftover
  before = tree_checksum(tmp_path / 'other')
  result = run('convert', tmp_path / 'ckpt', tmp_path / target, '--to', 'nnx', '--force', '--json')
  assert result.code == 0, result.stderr
  assert result.json['destination']['replaced']
  assert not os.path.islink(tmp_path / target)
  assert checkpoints.inspect(tmp_path / target).framework == 'nnx'
  assert tree_checksum(tmp_path / 'other') == before  # a link's target is never touched
  assert not [e for e in os.listdir(tmp_path) if '.partial-' in e or '.replaced-' in e]


def test_cli_dst_under_a_file_or_an_unwritable_directory_exits_2_with_json(tmp_path, saved, monkeypatch):
  world(tmp_path, saved)
  result = run('convert', tmp_path / 'ckpt', tmp_path / 'afile' / 'new', '--to', 'nnx', '--json')
  assert_refused(result, 'is a file, not a directory')
  monkeypatch.setattr(destination.os, 'access', lambda path, mode: False)
  result = run('convert', tmp_path / 'ckpt', tmp_path / 'new', '--to', 'nnx', '--json')
  assert_refused(result, 'is not writable')
  assert not os.path.lexists(tmp_path / 'new')


# -- the property --------------------------------------------------------------------

SRC_SPELLINGS = ['ckpt', 'ckpt_link', 'root_link/ckpt', '{root}/ckpt', 'other/../ckpt']
DST_SPELLINGS = [
    *OVERLAPS, 'new', 'new/deeper', '{root}/new', 'root_link/new', 'afile', 'afile/new',
    'empty', 'other', 'other_link', 'dangling', 'old_ckpt', 'inner_link',
]
LEFTOVERS = st.lists(
    st.tuples(st.sampled_from(['partial', 'replaced']), st.sampled_from(['dir', 'file', 'link_to_src'])),
    max_size=2,
)


def beside(root, dst: str) -> tuple[str, str]:
  """(DST's real parent, DST's name): where leftovers of runs on DST lie."""
  given = os.path.join(root, dst.format(root=root)).rstrip('/')
  return os.path.dirname(os.path.realpath(given)), os.path.basename(given)


def expected_refusal(root, src: str, dst: str, force: bool, leftovers) -> str | None:
  """What `convert` must say, decided from the situation, not by the code under test."""
  if dst in OVERLAPS:
    return OVERLAPS[dst]
  if dst.startswith('afile/'):
    return 'is a file, not a directory'
  exists = os.path.lexists(os.path.join(root, dst.format(root=root)))
  moved_aside = [what for kind, what in leftovers if kind == 'replaced']
  if not exists and os.path.isdir(beside(root, dst)[0]) and moved_aside:
    # A killed run had moved DST aside: it is put back first, if unambiguous.
    if len(moved_aside) > 1:
      return f'killed runs left {len(moved_aside)} earlier DSTs beside it'
    if moved_aside == ['link_to_src']:
      return 'is the source'
    if not force:
      return 'already exists (put back from'
    return None
  if exists and not force:
    return 'already exists; pass --force'
  if exists and dst == 'other':
    return 'holds something other than a checkpoint'
  return None


def plant(root, dst: str, leftovers, saved) -> None:
  """Leftovers of killed runs beside DST: staging directories, earlier DSTs."""
  parent, name = beside(root, dst)
  if not os.path.isdir(parent) or name in ('', '.', '..'):
    return
  for kind, what in leftovers:
    path = os.path.join(parent, f'.{name}.{kind}-{dead_pid()}')
    if what == 'dir' and kind == 'partial':
      os.makedirs(os.path.join(path, 'checkpoint'))
    elif what == 'dir':
      shutil.copytree(saved, path)  # the checkpoint that was DST
    elif what == 'file':
      with open(path, 'w') as f:
        f.write('leftover')
    else:
      os.symlink(os.path.join(root, 'ckpt'), path)


def put_back(entries: dict[str, str], root, dst: str) -> dict[str, str]:
  """`entries` (relative to `root`) after the one earlier DST is renamed to DST.

  Only once DST is known to lie outside SRC: one inside is never touched.
  """
  if dst in OVERLAPS:
    return entries
  parent, name = beside(root, dst)
  aside = [
      e for e in entries
      if os.path.dirname(os.path.join(root, e)) == parent
      and os.path.basename(e).startswith(f'.{name}.replaced-')
  ]
  if len(aside) != 1 or os.path.lexists(os.path.join(parent, name)):
    return entries
  new = os.path.relpath(os.path.join(parent, name), root)
  (old,) = aside
  return {
      (new + key[len(old):] if key == old or key.startswith(old + '/') else key): value
      for key, value in entries.items()
  }


def snapshot(root) -> dict[str, str]:
  """Every entry under `root` (links not followed) with its kind and content hash."""
  entries = {}
  for base, dirs, files in os.walk(root):
    for name in dirs + files:
      full = os.path.join(base, name)
      rel = os.path.relpath(full, root)
      if os.path.islink(full):
        entries[rel] = 'link:' + os.readlink(full)
      elif os.path.isfile(full):
        entries[rel] = 'file:' + tree_checksum(full)
      else:
        entries[rel] = 'dir'
  return entries


def leftovers_under(root) -> list[str]:
  return [
      os.path.join(base, name)
      for base, dirs, files in os.walk(root)
      for name in dirs + files
      if '.partial-' in name or '.replaced-' in name
  ]


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    src=st.sampled_from(SRC_SPELLINGS),
    dst=st.sampled_from(DST_SPELLINGS),
    force=st.booleans(),
    leftovers=LEFTOVERS,
    relative=st.booleans(),
)
@example(src='ckpt_link', dst='ckpt', force=True, leftovers=[], relative=True)
@example(src='ckpt', dst='inner_link/../new', force=True, leftovers=[('replaced', 'link_to_src')], relative=False)
@example(src='ckpt', dst='other_link', force=True, leftovers=[('replaced', 'file')], relative=True)
@example(src='other/../ckpt', dst='new/deeper', force=False, leftovers=[('partial', 'dir')], relative=True)
# Found by the nightly profile: a dead run's link to SRC was spared as if it
# lay inside SRC; an earlier DST put back was then refused as unexpected.
@example(src='ckpt', dst='new', force=False, leftovers=[('partial', 'link_to_src')], relative=False)
@example(src='ckpt', dst='new', force=False, leftovers=[('replaced', 'dir')], relative=False)
@example(src='ckpt', dst='new', force=True, leftovers=[('replaced', 'dir')], relative=True)
@example(src='ckpt', dst='new', force=True, leftovers=[('replaced', 'link_to_src')], relative=True)
@example(src='ckpt', dst='new', force=True, leftovers=[('replaced', 'file'), ('replaced', 'dir')], relative=True)
def test_convert_never_touches_src_whatever_the_paths(saved, src, dst, force, leftovers, relative):
  root = tempfile.mkdtemp(prefix='paths-')
  try:
    world(pathlib.Path(root), saved)
    plant(root, dst, leftovers, saved)
    refusal = expected_refusal(root, src, dst, force, leftovers)
    src_text, dst_text = src.format(root=root), dst.format(root=root)
    if not relative:
      src_text, dst_text = os.path.join(root, src_text), os.path.join(root, dst_text)
    source_bytes = tree_checksum(os.path.join(root, 'ckpt'))
    before = snapshot(root)
    after_refusal = put_back(before, root, dst)
    with cwd(root):
      args = ['convert', src_text, dst_text, '--to', 'nnx', '--json'] + (['--force'] if force else [])
      result = run(*args)
    assert tree_checksum(os.path.join(root, 'ckpt')) == source_bytes
    assert snapshot(os.path.join(root, 'other')) == {'keep.txt': before['other/keep.txt']}
    if refusal is not None:
      assert_refused(result, refusal)
      assert result.json['ok'] is False
      # Nothing was created, moved or removed, leftovers included, but for
      # an earlier DST that a killed run had moved aside: it is back.
      assert snapshot(root) == after_refusal
      return
    assert result.code == 0, result.stderr
    assert result.json['ok'] and result.json['verified']
    written = result.json['destination']['path']
    assert checkpoints.inspect(written).framework == 'nnx'
    assert not os.path.islink(written)
    # Leftovers of dead runs are gone; links among them went as links.
    assert leftovers_under(root) == []
  finally:
    shutil.rmtree(root, ignore_errors=True)
