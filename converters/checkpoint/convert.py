"""Converting a training-state checkpoint on disk, all or nothing.

`convert_checkpoint` reads SRC (Orbax or `flax.training.checkpoints`, Linen or
NNX, scanned or looped) straight into its shardings on a mesh, converts it in
memory (`converters.checkpoint.training_states`), writes an Orbax checkpoint that the
target implementation's ordinary `restore` reads, reads that back and compares
it bit for bit with what it converted (`converters.checkpoint.verify`), and only
then moves it into place.

SRC is only ever read: DST is checked against it on resolved paths before
anything is created (`converters.checkpoint.destination`). The output is written inside a
hidden sibling of DST (`.NAME.partial-PID/`) and renamed into place once
verified, so DST is absent or complete at every instant, even if the process is
killed; an existing DST is replaced only with `force`, by two renames. Partial
outputs that a killed run left behind are removed by the next run for the same
DST.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import shutil
import time
from collections.abc import Callable

import jax

from converters.allocator import release_free_memory
from converters.checkpoint import inspect as checkpoints
from converters.checkpoint import training_states
from converters.checkpoint import recipes, streaming, weights
from converters.checkpoint.models import ModelPair, check_model_pair
from converters.checkpoint.orbax_files import CheckpointWriter, SourceCheckpoint
from converters.checkpoint.destination import (
    Destination,
    check_replaceable,
    plan_destination,
    remove_entry,
)
from converters.checkpoint.verify import verify
from converters.distributed import agree, exchange
from converters.errors import CheckpointError, VerificationError
from converters.paths import Framework

STAGES = ['reading', 'converting', 'writing', 'verifying', 'renaming']
FRAMEWORKS = ('linen', 'nnx')


def _fsync_directory(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _move_into_place(partial: str, destination: Destination) -> None:
  """Renames `partial` to DST; an existing DST is replaced by two renames.

  If the second rename fails, the replaced DST is put back.
  """
  dst = destination.path
  old = destination.sibling('replaced', os.getpid())
  replacing = os.path.lexists(dst)
  # DST may have appeared (or changed) since it was checked: check again.
  if replacing and not destination.force:
    raise CheckpointError(
        f'{dst}: appeared while converting (another run or program wrote it); '
        'it was left as it is; pass --force to replace it',
        [dst],
    )
  if replacing:
    check_replaceable(dst, dst)
  try:
    if replacing:
      os.rename(dst, old)
    try:
      os.rename(partial, dst)
    except OSError:
      if replacing:
        os.rename(old, dst)
      raise
  except OSError as e:
    raise CheckpointError(
        f'{dst}: the verified checkpoint could not be moved into place: '
        f'{e.strerror or e}; DST is as it was'
    ) from e
  if replacing:
    try:
      remove_entry(old)
    except OSError:
      pass  # DST is in place; the next run for DST removes what is left
  _fsync_directory(destination.parent)


def _remove_staging(staging: str, settle: bool) -> None:
  """Removes the staging directory. After a failed write (`settle`), Orbax's
  writer threads may still be creating files in it for a moment: it is
  removed again until it stays gone (for up to a few seconds)."""
  shutil.rmtree(staging, ignore_errors=True)
  if not settle:
    return
  deadline = time.monotonic() + 5.0
  gone_since = time.monotonic()
  while time.monotonic() < deadline and time.monotonic() - gone_since < 0.5:
    time.sleep(0.05)
    if os.path.lexists(staging):
      shutil.rmtree(staging, ignore_errors=True)
      gone_since = time.monotonic()


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
  """How `convert_checkpoint` reads, writes and reports; checked when made.

  Attributes:
    seed: seeds the RNG streams (dropout keys) of an NNX target, which a
      Linen state does not have.
    force: replace an existing DST (a checkpoint, a file, a symlink, which
      is replaced as a link, or an empty directory).
    allow_unfinished: read an Orbax save of SRC that never finished.
    in_memory: restore SRC onto the mesh, convert it there and save it (the
      path for conversions that also need the arrays on devices); by default
      SRC is streamed from disk to disk (`converters.checkpoint.streaming`).
    memory_budget: streaming holds at most this many bytes of array data at
      once (a single chunk larger than it alone); None: 1 GiB
      (`streaming.DEFAULT_MEMORY_BUDGET`). Not with `in_memory`, which does
      not stream.
    on_stage: called with each stage of `STAGES` as it starts (the command
      line draws its progress from it).
  """

  seed: int = 0
  force: bool = False
  allow_unfinished: bool = False
  in_memory: bool = False
  memory_budget: int | None = None
  on_stage: Callable[[str], None] | None = None

  def __post_init__(self):
    budget = self.memory_budget
    if self.in_memory and budget is not None:
      raise CheckpointError(
          f'memory_budget={budget!r} bounds the streaming conversion, and in_memory=True '
          'restores SRC whole instead: give one of them (--memory-budget or --in-memory)'
      )
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 2**20
    ):
      raise CheckpointError(f'memory_budget={budget!r}: give a number of bytes of at least 1 MiB')

  @property
  def budget(self) -> int:
    """The streaming's memory budget in bytes."""
    return streaming.DEFAULT_MEMORY_BUDGET if self.memory_budget is None else int(self.memory_budget)


def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    to: Framework,
    *,
    models: ModelPair | None = None,
    layout: str | None = None,
    options: CheckpointOptions | None = None,
) -> dict:
  """Converts the checkpoint at `src` into an Orbax checkpoint at `dst`.

  Args:
    src: an Orbax checkpoint of a training state (a Linen `TrainState`, or
      an NNX `{'model', 'optimizer'}` state), or a `flax.training.checkpoints`
      checkpoint or directory.
    dst: where to write; must not exist unless `options.force`.
    to: 'linen' or 'nnx'.
    models: the Linen model and its NNX port whose training state SRC holds
      (`UserModels(linen_model, nnx_model, paths=..., optimizer=...)`), with
      the mesh to convert on (any `ModelPair`: the kit's own MLP is
      `linen_nnx_cli.kit_models.KitModels()`).
    layout: 'scan' or 'loop'; None keeps SRC's (a model factory must take
      `layout=` to make another one).
    options: how to read, write and report (`CheckpointOptions`).

  Returns:
    A JSON-ready summary: source and destination, step, mesh.

  Raises:
    CheckpointError: bad SRC or DST, or SRC does not hold the models'
      training state (every differing leaf listed); nothing is written.
    ConversionError: the state cannot be converted as asked (unmapped or
      ambiguous paths, annotations); found before any array is read, and
      nothing is written.
    VerificationError: the written checkpoint differs; it is deleted.
  """
  models, options = _checked_arguments(to, layout, models, options)
  on_stage = options.on_stage or (lambda stage: None)
  source_path, _ = checkpoints.locate(src)
  destination = plan_destination([os.fspath(src), source_path], dst, options.force)
  dst = destination.path

  on_stage('reading')
  info = checkpoints.inspect(source_path, options.allow_unfinished)
  agree('checkpoint conversion', {
      'src': source_path, 'dst': dst, 'to': to, 'layout': layout, 'force': options.force,
      'in_memory': options.in_memory, 'memory_budget': options.budget,
      'models': models.agreement(), 'seed': options.seed, 'source': info.summary(),
  })
  plan = models.plan(info, to, layout)
  if info.weights:  # which model's weights, the models found
    info = dataclasses.replace(info, framework=plan.source.framework)
  plan = _checked_plan(plan, info, to, layout)
  # What SRC is comes from SRC; the models add their own description.
  source_summary = {**info.summary(), 'layout': plan.source.layout}
  source_summary |= {k: v for k, v in models.summary(info).items() if k not in source_summary}
  checkpoints.check_structure(
      info, checkpoints.leaves_of(plan.source.abstract_state), plan.source.what
  )
  checkpoints.check_tree(info, plan.source.abstract_state)
  if options.in_memory:
    leaves, replaced, step = _convert_in_memory(info, plan, destination, options.seed, on_stage)
  else:
    leaves, replaced, step = _convert_streaming(
        info, plan, destination, options.seed, options.budget, on_stage
    )
  converted = {
      'path': dst, 'format': 'orbax', 'framework': to, 'layout': plan.target.layout,
      'leaves': leaves, 'replaced': replaced,
  }
  if info.weights:
    source_summary['form'] = weights.describe(plan.source)
    converted['form'] = weights.describe(plan.target)
  return _summary(plan, options, source=source_summary, destination=converted, step=step)


def _checked_arguments(to, layout, models, options) -> tuple[ModelPair, CheckpointOptions]:
  """`convert_checkpoint`'s `models` and `options` (the defaults where None), refused before anything is read."""
  if to not in FRAMEWORKS:
    raise CheckpointError(f'to={to!r}: choose one of {FRAMEWORKS}')
  if layout not in (None, 'scan', 'loop'):
    raise CheckpointError(f'layout={layout!r}: choose scan or loop')
  models = check_model_pair(models)
  options = CheckpointOptions() if options is None else options
  if not isinstance(options, CheckpointOptions):
    raise CheckpointError(f'options={options!r}: give CheckpointOptions(...)')
  return models, options


def _checked_plan(plan, info, to: Framework, layout: str | None):
  """`plan`, refused unless it reads SRC's framework and writes `to` in `layout`
  (a model pair of one's own may plan otherwise; nothing is read yet)."""
  wrong = []
  if plan.source.framework != info.framework:
    wrong.append(f'reads {plan.source.framework}, SRC is {info.framework}')
  if plan.target.framework != to:
    wrong.append(f'writes {plan.target.framework}, {to} was asked for')
  if layout is not None and plan.target.layout not in (layout, None):
    wrong.append(f'writes the {plan.target.layout} layout, {layout} was asked for')
  if wrong:
    raise CheckpointError(
        f"the models' plan {'; '.join(wrong)}: a ModelPair's plan(info, to, layout) must "
        'read the checkpoint it is given and write what is asked'
    )
  return plan


def _summary(plan, options: CheckpointOptions, *, source: dict, destination: dict, step) -> dict:
  """What `convert_checkpoint` returns: JSON-ready."""
  kept, seeded = training_states.rng_state(plan)
  return {
      'source': source,
      'destination': destination,
      # NNX RNG streams (dropout keys): kept from an NNX source where they
      # match, else seeded from `seed`; Linen has none, so going to Linen
      # drops them (listed).
      'rng_state': {
          'kept': kept, 'seeded': seeded, 'seed': options.seed,
          'dropped': training_states.rng_dropped(plan),
      },
      'step': None if step is None else int(step),
      'mesh': list(plan.mesh.shape.values()),
      'verified': True,
      'streamed': not options.in_memory,
      'memory_budget': None if options.in_memory else options.budget,
  }


def _convert_in_memory(info, plan, destination: Destination, seed, on_stage) -> tuple[int, bool, int | None]:
  """Restores SRC onto the mesh, converts it there, saves and reads it back;
  `(leaves, replaced, step)`, no step for weights only."""
  # Each stage's temporary host buffers go back to the system before the next
  # stage allocates its own (see converters.allocator).
  release_free_memory()
  with jax.set_mesh(plan.mesh):
    # A dry run on the abstract state: unmapped paths, annotations and
    # layouts are refused before any array is read.
    training_states.convert(plan.source.abstract_state, plan, rngs=seed)
    state = checkpoints.restore(info, plan.source.abstract_state)
    release_free_memory()

    on_stage('converting')
    # The restored state is ours: a relayout frees its sources group by group.
    converted = training_states.convert(state, plan, donate=True, rngs=seed)
    del state  # the converted state holds every array it still needs
    release_free_memory()

    def save(partial: str) -> None:
      checkpoints.save(partial, converted)
      release_free_memory()

    def check(partial: str) -> int:
      leaves = verify(partial, converted)
      release_free_memory()
      return leaves

    replaced, leaves = _write_in_place(destination, save, check, on_stage)
  if plan.target.weights:
    return leaves, replaced, None
  step = converted.step if plan.target.framework == 'linen' else converted['optimizer']['step'][...]
  return leaves, replaced, int(step)


def _convert_streaming(info, plan, destination: Destination, seed, budget: int, on_stage) -> tuple[int, bool, int | None]:
  """Moves SRC's chunks into an Orbax checkpoint by the conversion's recipes
  (`converters.checkpoint.streaming`); `(leaves, replaced, step)`, no step for weights only."""
  target, made = recipes.recipes(plan, rngs=seed)  # the dry run: every check, nothing read
  with jax.set_mesh(plan.mesh):
    checkpoints.check_integer_scalars(info, plan.source.abstract_state)
  source = SourceCheckpoint(info, cache_bytes=budget // streaming.CACHE_SHARE)
  streaming.open_source(source)
  layout = streaming.plan_layout(made, target, source, budget)
  processes, me = jax.process_count(), jax.process_index()
  mine = streaming.share(layout.chunks, me, processes)
  written = {}
  on_stage('converting')

  def save(partial: str) -> None:
    writer = CheckpointWriter(partial, me)
    failure = None
    try:
      written.update(streaming.write(layout, source, writer, mine, budget, create=me == 0))
    except CheckpointError as e:
      failure = e
    _raise_any_failure('chunks written', failure, lambda p, f: CheckpointError(f, [destination.path]))
    failure = None
    if me == 0:
      try:
        os.makedirs(partial, exist_ok=True)
        writer.merge()
        writer.write_metadata(target, layout.arrays, streaming.extension_metadata(layout, source))
      except Exception as e:  # OSError for a full disk, TensorStore's errors
        failure = f'{partial}: writing the checkpoint failed: {checkpoints.reason(e)}'
    _raise_first_failure('checkpoint merged', failure, destination.path)
    release_free_memory()

  def check(partial: str) -> int:
    return streaming.verify(partial, target, mine, written, budget)

  replaced, leaves = _write_in_place(destination, save, check, on_stage)
  return leaves, replaced, None if plan.target.weights else streaming.step(layout, source)


def _raise_first_failure(label: str, failure: str | None, dst: str) -> None:
  """After a step only the first process takes: every process raises its failure."""
  failures = [f for f in exchange(label, failure) if f is not None]
  if failures:
    raise CheckpointError(failures[0], [dst])


def _raise_any_failure(label: str, failure: Exception | None, of_another) -> None:
  """After a step every process takes: a process raises its own failure, else
  the first other process's, as `of_another(process, message)`."""
  failures = exchange(label, None if failure is None else str(failure))
  if failure is not None:
    raise failure
  for process, message in enumerate(failures):
    if message is not None:
      raise of_another(process, message)


def _write_in_place(destination: Destination, save, check, on_stage) -> tuple[bool, int]:
  """Writes DST with `save(partial)` in a staging sibling, verifies it with
  `check(partial)` (every process its own share; all must pass) and renames
  it into place; `(replaced, leaves checked)`. The staging directory goes,
  with the parents it created, whatever fails."""
  on_stage('writing')
  dst = destination.path
  # One process (the first) handles directories; all write their shards
  # into the same staging directory, named after the first one's pid.
  first = jax.process_index() == 0
  staging = destination.sibling('partial', exchange('staging directory', os.getpid())[0])
  partial = os.path.join(staging, 'checkpoint')
  failure = None
  created = destination.missing_parents() if first else []
  moved = False
  if first:
    destination.remove_stale()
    try:
      destination.make_staging(os.getpid())
    except CheckpointError as e:
      failure = str(e)
  # Every process learns whether the first one could create it.
  _raise_first_failure('staging directory created', failure, dst)
  try:
    save(partial)
    replaced = os.path.lexists(dst)
    on_stage('verifying')
    try:
      leaves = check(partial)
      failure = None
    except VerificationError as e:
      leaves, failure = 0, e
    # Each process verified its own shards: all must pass.
    _raise_any_failure('verification', failure, lambda p, f: VerificationError(
        f'{partial}: process {p} found differences: {f}'
    ))
    on_stage('renaming')
    failure = None
    if first:
      try:
        _move_into_place(partial, destination)
        moved = True
      except CheckpointError as e:
        failure = str(e)
    _raise_first_failure('renamed into place', failure, dst)
  finally:
    if first:
      _remove_staging(staging, settle=not moved)
      if not moved:  # failed: the parents it created go too
        for parent in reversed(created):
          try:
            os.rmdir(parent)
          except OSError:
            break
  return replaced, leaves
