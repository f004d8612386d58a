"""What a training-state checkpoint holds, and reading it into its shardings.

`inspect` reads a checkpoint's structure without reading array data: its
format (an Orbax checkpoint directory, as Orbax's `StandardCheckpointer` and
`flax.training.checkpoints` write by default, or the legacy msgpack file of
`flax.training.checkpoints`), the framework that wrote it (a Linen
`TrainState`, or an NNX `{'model', 'optimizer'}` state; any other tree is
weights only, whose framework and form the models tell:
`converters.checkpoint.weights`), and every leaf's shape and dtype. It
knows no model: which model the arrays belong to comes from the
caller (`converters.checkpoint.models`). `check_structure` compares the
checkpoint leaf by leaf with a model's abstract training state; `restore`
reads it straight into that state's shardings, the target the ordinary Orbax
restore fills, a bounded number of bytes at a time (an msgpack file holds
whole arrays, so it is read on the host and each device receives only its
shards); `save` writes a training state as the ordinary Orbax save does.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from converters import compat
from converters.errors import CheckpointError, ShapeError, format_offenders
from converters.paths import Framework
from converters.flat_trees import key_of

#: The arrays a checkpoint stores, `{path: (shape, dtype name)}` (a
#: target's leaves, `converters.filling.Leaves`, hold arrays and annotations).
StoredLeaves = Mapping[tuple[str, ...], tuple[tuple[int, ...], str]]

# Orbax stages each shard in a host buffer before copying it to its device and
# by default reads everything at once (96 GB): bounding what it reads at a time
# bounds that staging memory on top of the restored state.
RESTORE_CONCURRENT_GB = 0.25
_ORBAX_MARKERS = ('_METADATA', '_CHECKPOINT_METADATA', 'manifest.ocdbt')
# What an Orbax checkpoint directory holds (0.12, OCDBT and not).
_ORBAX_ENTRIES = frozenset(
    _ORBAX_MARKERS
    + ('_sharding', 'array_metadatas', 'd', 'descriptor', 'commit_success.txt', 'ocdbt.process')
)
_ORBAX_PROCESS = re.compile(r'ocdbt\.process_\d+')


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
  """What a checkpoint holds.

  Attributes:
    path: the checkpoint itself: an Orbax directory or an msgpack file.
    format: 'orbax' or 'flax-msgpack'.
    framework: 'linen' (a `TrainState`) or 'nnx' (`{'model', 'optimizer'}`);
      None for weights only until the models say which.
    leaves: `{path: (shape, dtype)}` of every array, keys as strings.
    tree: the nested structure as stored (Orbax's metadata tree, which keeps
      empty optax states; or the msgpack tree).
    host_tree: the arrays of an msgpack file, read whole.
    unfinished: an Orbax save that never finished, read on request.
    use_zarr3: its arrays are zarr v3 (Orbax's `use_zarr3`); zarr v2 else.
    weights: it holds weights only: a tree other than a training state.
  """

  path: str
  format: str
  framework: Framework
  leaves: StoredLeaves
  tree: Any = dataclasses.field(default=None, repr=False, compare=False)
  host_tree: Any = dataclasses.field(default=None, repr=False, compare=False)
  unfinished: bool = False
  use_zarr3: bool = False
  weights: bool = False

  @property
  def nbytes(self) -> int:
    return sum(
        int(np.prod(shape)) * np.dtype(dtype).itemsize
        for shape, dtype in self.leaves.values()
    )

  def summary(self) -> dict:
    return {
        'path': self.path, 'format': self.format, 'framework': self.framework,
        'leaves': len(self.leaves), 'bytes': self.nbytes,
    } | ({'weights_only': True} if self.weights else {})


def string_path(keypath) -> tuple[str, ...]:
  """A pytree key path as strings, the form both Orbax and msgpack trees use."""
  return tuple(str(key_of(k)) for k in keypath)


def _join(path: tuple[str, ...]) -> str:
  return '/'.join(path)


def _flax_steps(entries) -> list[str]:
  return [e for e in entries if re.fullmatch(r'checkpoint_\d+', e)]


def is_checkpoint_directory(path: str, only: bool = False) -> bool:
  """Whether `path` is an Orbax checkpoint or a `flax.training.checkpoints` directory.

  With `only`, it must hold nothing else (an empty directory counts): what
  `--force` may replace without losing anything that is not a checkpoint.
  """
  entries = set(os.listdir(path))
  if not only:
    return bool(entries & set(_ORBAX_MARKERS) or _flax_steps(entries))
  if entries & set(_ORBAX_MARKERS):
    return all(e in _ORBAX_ENTRIES or _ORBAX_PROCESS.fullmatch(e) for e in entries)
  return len(_flax_steps(entries)) == len(entries)


def locate(path: str | os.PathLike) -> tuple[str, str]:
  """`(checkpoint path, format)` of a checkpoint or a checkpoints directory."""
  given = os.fspath(path)
  # As the OS resolves it: `link/..` is the parent of where `link` points.
  path = os.path.realpath(given if os.path.isabs(given) else os.path.join(os.getcwd(), given))
  if not os.path.exists(path):
    raise CheckpointError(f'{given}: no such file or directory')
  if os.path.isfile(path):
    return path, 'flax-msgpack'
  if not os.path.isdir(path):
    raise CheckpointError(f'{given}: is neither a checkpoint directory nor a checkpoint file')
  try:
    entries = set(os.listdir(path))
  except OSError as e:
    raise CheckpointError(f'{given}: cannot be read: {e.strerror or e}') from e
  if entries & set(_ORBAX_MARKERS):
    return path, 'orbax'
  steps = _flax_steps(entries)
  if steps:  # a flax.training.checkpoints directory: its newest step
    newest = max(steps, key=lambda e: int(e.rsplit('_', 1)[1]))
    return locate(os.path.join(path, newest))
  raise CheckpointError(
      f'{path}: not a checkpoint: an Orbax checkpoint has a _METADATA file and a '
      'flax.training.checkpoints directory has checkpoint_<step> entries; '
      f'found {format_offenders(sorted(entries)) or "an empty directory"}'
  )


def _step_metadata(path: str) -> Any:
  """Orbax's step metadata (item metadata and commit time); reads no array data."""
  import orbax.checkpoint as ocp

  compat.ignore_stray_orbax_callbacks()
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      step = checkpointer.metadata(path)
    if step.item_metadata is None:  # Orbax logs why and returns None
      raise ValueError('Orbax found no item metadata')
  except Exception as e:  # Orbax raises many types for unreadable metadata
    raise CheckpointError(
        f'{path}: the checkpoint is corrupted or incomplete; reading its Orbax '
        f'metadata failed: {reason(e)}'
    ) from e
  return step


def orbax_metadata(path: str) -> Any:
  """Orbax's item metadata of the checkpoint at `path` (`.tree`, `.use_zarr3`).

  Reads no array data. Raises `CheckpointError` when it cannot be read.
  """
  return _step_metadata(path).item_metadata


def unfinished_reason(path: str, step_metadata: Any) -> str | None:
  """Why the Orbax checkpoint at `path` is an unfinished save, or None.

  Orbax writes into a temporary directory (or without its commit file on
  object stores) and records a commit time once the save is complete; a copy
  of a save still in progress has the start time and no commit time.
  """
  import orbax.checkpoint as ocp

  if not ocp.utils.is_checkpoint_finalized(path):
    return 'Orbax does not consider it finalized (a temporary save directory)'
  if step_metadata.init_timestamp_nsecs is not None and step_metadata.commit_timestamp_nsecs is None:
    return 'its Orbax metadata records when the save started but no commit'
  return None


def stored_form(v) -> tuple[tuple[int, ...], str]:
  """Shape and dtype as stored: a PRNG key array as its key data (uint32)."""
  if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key):
    v = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(v.shape, v.dtype))
  return tuple(v.shape), str(np.dtype(v.dtype))


def leaves_of(tree: Any) -> StoredLeaves:
  """`{path: (shape, dtype)}` of every array of `tree` (arrays or their metadata)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {string_path(k): stored_form(v) for k, v in leaves}


def _msgpack_tree(path: str) -> Any:
  from flax import serialization

  with open(path, 'rb') as f:
    data = f.read()
  try:
    tree = serialization.msgpack_restore(data)
  except Exception as e:  # msgpack raises several types for bad data
    raise CheckpointError(
        f'{path}: not a readable flax.training.checkpoints msgpack file '
        f'({len(data)} bytes): {reason(e)}'
    ) from e
  if not isinstance(tree, dict):
    raise CheckpointError(f'{path}: holds a {type(tree).__name__}, not a state dict')
  return tree


def reason(e: BaseException) -> str:
  """`Type: first line` of an exception, for one-line error messages."""
  text = str(e).strip().splitlines()
  return f'{type(e).__name__}: {text[0] if text else ""}'.strip()


def inspect(path: str | os.PathLike, allow_unfinished: bool = False) -> CheckpointInfo:
  """Reads what the checkpoint at `path` holds, without its array data.

  Args:
    path: a checkpoint, or a `flax.training.checkpoints` directory.
    allow_unfinished: accept an Orbax save that never finished (its arrays
      may be incomplete).

  Raises:
    CheckpointError: the path is missing, unreadable, an unfinished save, or
      not a training state of either framework.
  """
  path, format = locate(path)
  host_tree = None
  unfinished = use_zarr3 = False
  if format == 'orbax':
    step = _step_metadata(path)
    why = unfinished_reason(path, step)
    if why is not None and not allow_unfinished:
      raise CheckpointError(
          f'{path}: an unfinished Orbax save ({why}), so its arrays may be '
          'incomplete; wait for the save to finish, or pass --allow-unfinished '
          '(allow_unfinished=True; CheckpointOptions(allow_unfinished=True) for '
          'convert_checkpoint) to read it anyway'
      )
    unfinished = why is not None
    tree = step.item_metadata.tree  # keeps the empty optax states
    use_zarr3 = bool(step.item_metadata.use_zarr3)
    leaves = leaves_of(tree)
  else:
    host_tree = tree = _msgpack_tree(path)
    flat = jax.tree_util.tree_flatten_with_path(host_tree)[0]
    leaves = {
        string_path(k): (tuple(np.shape(v)), str(np.asarray(v).dtype)) for k, v in flat
    }
  # The stored tree's own keys: an empty optimizer state (optax.sgd without
  # momentum) has no leaves, but its key is there.
  tops = set(tree) if isinstance(tree, Mapping) else {p[0] for p in leaves}
  framework: Framework | None = None
  if {'step', 'params'} <= tops:
    framework = 'linen'
  elif {'model', 'optimizer'} <= tops:
    framework = 'nnx'
  elif not leaves:
    raise CheckpointError(f'{path}: holds no arrays')
  return CheckpointInfo(
      path, format, framework, leaves, tree, host_tree, unfinished, use_zarr3, weights=framework is None,
  )


def _compatible(have: tuple, want: tuple) -> bool:
  """Whether a stored leaf restores as `want`: the same shape and dtype, or
  integer scalars of two widths (a step or count saved as a Python int is
  int64, one a jitted step returned is int32; Orbax casts it on restore)."""
  if have == want:
    return True
  (have_shape, have_dtype), (want_shape, want_dtype) = have, want
  return have_shape == want_shape == () and all(
      np.issubdtype(np.dtype(d), np.integer) for d in (have_dtype, want_dtype)
  )


def differences(leaves: StoredLeaves, wanted: StoredLeaves) -> tuple[list[str], list[str], list[str]]:
  """`(missing, unexpected, differing)` leaves of `leaves` against `wanted`."""
  missing = sorted(_join(p) for p in set(wanted) - set(leaves))
  extra = sorted(_join(p) for p in set(leaves) - set(wanted))
  differing = sorted(
      f'{_join(p)} {leaves[p][0]} {leaves[p][1]} (expected {w[0]} {w[1]})'
      for p, w in wanted.items()
      if p in leaves and not _compatible(leaves[p], w)
  )
  return missing, extra, differing


def check_structure(info: CheckpointInfo, wanted: StoredLeaves, what: str) -> None:
  """Raises `CheckpointError` listing every leaf that is missing or differs.

  `what` names the model whose training state `wanted` is, for the message.
  """
  missing, extra, differing = differences(info.leaves, wanted)
  if missing or extra or differing:
    held = 'weights' if info.weights else f'{info.framework} training state'
    found = ', '.join(
        f'{label} [{format_offenders(paths)}]'
        for label, paths in (('missing', missing), ('unexpected', extra),
                             ('shape or dtype differs', differing)) if paths)
    raise CheckpointError(
        f'{info.path}: does not hold the {held} of {what}: {found}; check that the model, its '
        'configuration and the optimizer are the ones the checkpoint was '
        'trained with',
        missing + extra + differing,
    )


def restore(info: CheckpointInfo, target: Any) -> Any:
  """The checkpoint read into `target`'s shardings (a `TrainState` or `nnx.State`).

  `target` is an abstract training state whose `ShapeDtypeStruct`s carry
  their shardings (`Side.abstract_state`). What the ordinary Orbax restore
  returns, with Orbax reading at most `RESTORE_CONCURRENT_GB` at a time. Call
  with the target's mesh in context (`jax.set_mesh`).
  """
  import orbax.checkpoint as ocp
  from etils import epath

  check_integer_scalars(info, target)
  if info.format == 'flax-msgpack':
    return _place_host_tree(info, target)
  check_tree(info, target)  # the same leaves in another tree, which Orbax's restore refuses
  handler = ocp.StandardCheckpointHandler(restore_concurrent_gb=RESTORE_CONCURRENT_GB)
  compat.ignore_stray_orbax_callbacks()
  try:
    if info.unfinished:  # the Checkpointer refuses it; its handler reads it
      try:
        return handler.restore(epath.Path(info.path), args=ocp.args.StandardRestore(target))
      finally:
        handler.close()
    with ocp.Checkpointer(handler) as checkpointer:
      return checkpointer.restore(info.path, target)
  except Exception as e:  # Orbax and TensorStore raise many types for bad data
    raise CheckpointError(
        f'{info.path}: the checkpoint is corrupted or incomplete; reading its '
        f'arrays failed: {reason(e)}'
    ) from e


def _sized(form) -> bool:
  """Whether one side of an Orbax tree difference is `(container type, size)`."""
  return isinstance(form, tuple) and len(form) == 2 and isinstance(form[0], type) and isinstance(form[1], int)


def _node(form) -> str:
  """One side of an Orbax tree difference: `(list, 3)` as 'list of 3'."""
  return f'{form[0].__name__} of {form[1]}'


def check_tree(info: CheckpointInfo, target: Any) -> None:
  """Refuses an Orbax checkpoint whose tree is not `target`'s, though its leaves are.

  The same arrays in another tree (adamw's three optax states, one of them
  empty, against adam's two) read leaf by leaf, but not with the ordinary
  Orbax restore: the models' optimizer is not the one it was trained with.
  """
  import orbax.checkpoint as ocp

  if info.format != 'orbax':
    return
  diff = ocp.tree.tree_difference(
      ocp.tree.serialize_tree(target, keep_empty_nodes=True), info.tree,
      is_leaf=lambda x: not (isinstance(x, (dict, list)) and x), leaves_equal=lambda a, b: True,
  )
  if diff is None:
    return
  flat = {
      path: d
      for path, d in ocp.tree.to_flat_dict(
          diff, is_leaf=lambda x: hasattr(x, 'lhs') and hasattr(x, 'rhs')
      ).items()
      # Only containers of different sizes (adam's two optax states against
      # adamw's three): empty nodes (a None field, an empty state) and one
      # container type for another (a dict saved for a tuple) hold no arrays,
      # and the leaves were checked already.
      if _sized(d.lhs) and _sized(d.rhs) and d.lhs[1] != d.rhs[1]
  }
  if not flat:
    return
  where = [
      f'{_join(tuple(map(str, path))) or "the root"} (the models: {_node(d.lhs)}, the '
      f'checkpoint: {_node(d.rhs)})'
      for path, d in flat.items()
  ]
  raise CheckpointError(
      f'{info.path}: holds the arrays of the training state the models give, but in '
      f'another tree: {format_offenders(where)}; the optimizer (or the model) is not '
      'the one it was trained with: give that one',
      [_join(tuple(map(str, path))) for path in flat],
  )


def _stored_scalars(info: CheckpointInfo, paths: list[tuple[str, ...]]) -> dict[tuple, int]:
  """The stored values of the integer scalars at `paths`, read alone."""
  import orbax.checkpoint as ocp

  if info.format == 'flax-msgpack':
    flat = {
        string_path(k): v for k, v in jax.tree_util.tree_flatten_with_path(info.host_tree)[0]
    }
    return {p: int(np.asarray(flat[p])) for p in paths}
  item, restore_args = {}, {}
  for path in paths:
    node, args = item, restore_args
    for key in path[:-1]:
      node, args = node.setdefault(key, {}), args.setdefault(key, {})
    node[path[-1]] = np.zeros((), info.leaves[path][1])
    args[path[-1]] = ocp.RestoreArgs(restore_type=np.ndarray)
  compat.ignore_stray_orbax_callbacks()
  try:
    with ocp.PyTreeCheckpointer() as checkpointer:
      restored = checkpointer.restore(info.path, args=ocp.args.PyTreeRestore(
          item=item, restore_args=restore_args, partial_restore=True,
      ))
  except Exception as e:  # Orbax and TensorStore raise many types for bad data
    raise CheckpointError(
        f'{info.path}: the checkpoint is corrupted or incomplete; reading its '
        f'counters failed: {reason(e)}'
    ) from e
  values = {}
  for path in paths:
    node = restored
    for key in path:
      node = node[key]
    values[path] = int(np.asarray(node))
  return values


def check_integer_scalars(info: CheckpointInfo, target: Any) -> None:
  """Refuses a step or count that the target's integer dtype cannot hold.

  A counter saved as a Python int is stored as int64; the training state
  JAX restores holds int32 (without `jax_enable_x64`) or NNX's uint32, and
  Orbax casts on restore, wrapping a value that does not fit. Those stored
  wider than the target (or of another signedness) are read alone first.
  """
  wanted = leaves_of(target)
  narrowed = sorted(
      p for p, (shape, dtype) in info.leaves.items()
      if shape == () and p in wanted and dtype != wanted[p][1]
      and np.issubdtype(np.dtype(dtype), np.integer)
      and np.issubdtype(np.dtype(wanted[p][1]), np.integer)
  )
  if not narrowed:
    return
  problems = []
  for path, value in _stored_scalars(info, narrowed).items():
    limits = np.iinfo(np.dtype(wanted[path][1]))
    if not limits.min <= value <= limits.max:
      problems.append((_join(path), (
          f'{_join(path)} = {value} (stored as {info.leaves[path][1]}) does not fit '
          f'the target\'s {limits.dtype} [{limits.min}, {limits.max}]'
      )))
  if problems:
    raise ShapeError(
        f'{info.path}: {"; ".join(text for _, text in problems)}',
        [path for path, _ in problems],
        fix='restoring it would wrap the value; enable 64-bit integers '
        "(jax.config.update('jax_enable_x64', True)) to keep it, or save the state "
        'with the counter reset (state.replace(step=...))',
    )


def save(path: str, state: Any) -> None:
  """Writes `state` to the new directory `path` as Orbax's `StandardCheckpointer`
  does (what `linen_impl.checkpoint.save` and `nnx_impl.checkpoint.save` do) and
  waits until it is complete."""
  import orbax.checkpoint as ocp

  checkpointer = ocp.StandardCheckpointer()
  try:
    checkpointer.save(os.path.abspath(path), state)
    checkpointer.wait_until_finished()
  except Exception as e:  # Orbax and TensorStore raise many types (OSError for a full disk)
    try:  # its background writes end before the caller removes what they wrote
      checkpointer.wait_until_finished()
    except Exception:
      pass
    raise CheckpointError(
        f'{path}: writing the checkpoint failed: {reason(e)}; is the disk full or '
        'over a quota? Nothing was moved into place'
    ) from e
  finally:
    try:
      checkpointer.close()
    except Exception:
      pass


def _place_host_tree(info: CheckpointInfo, target) -> Any:
  flat = {
      string_path(k): v for k, v in jax.tree_util.tree_flatten_with_path(info.host_tree)[0]
  }

  def place(keypath, abstract):
    value = np.asarray(flat[string_path(keypath)])
    return jax.device_put(value, abstract.sharding)  # each device gets its shards

  return jax.tree_util.tree_map_with_path(place, target)
