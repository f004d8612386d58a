"""What a training-state checkpoint holds, and reading it into its shardings.

`inspect` reads a checkpoint's structure without reading array data: its
format (an Orbax checkpoint directory, as `linen_impl.checkpoint`,
`nnx_impl.checkpoint` and `flax.training.checkpoints` write by default, or the
legacy msgpack file of `flax.training.checkpoints`), the framework that wrote
it, the layer layout, the model size, dtype and optimizer, and every leaf's
shape and dtype. `trainer_for` builds the trainer of that model on a mesh;
`check_structure` compares the checkpoint leaf by leaf with what that trainer
saves; `restore` reads it straight into the trainer's shardings, into the same
target the implementation's own `restore` fills, a bounded number of bytes at a
time (an msgpack file holds whole arrays, so it is read on the host and each
device receives only its shards).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from converters.errors import CheckpointError, format_offenders
from converters.paths import Framework
from converters.tree_io import key_of
from kit_mlp.description import GUIDE_RULES, ModelDescription
from kit_mlp.optimizers import make_tx

Leaves = Mapping[tuple[str, ...], tuple[tuple[int, ...], str]]

# The keys of the first optax state of each optimizer the kit trains with.
# adam and adamw keep the same arrays: a Linen checkpoint tells them apart by
# its number of (empty) optax states, an NNX one cannot (NNX drops empty
# states), so `with_optimizer` lets the caller say which.
_OPTAX_STATE_KEYS = {
    frozenset({'count', 'mu', 'nu'}): 'adam',
    frozenset({'trace'}): 'sgd_momentum',
    frozenset({'count', 'ema'}): 'fsdp_sgd',
}
# Orbax stages each shard in a host buffer before copying it to its device and
# by default reads everything at once (96 GB): bounding what it reads at a time
# bounds that staging memory on top of the restored state.
RESTORE_CONCURRENT_GB = 0.25
_ORBAX_MARKERS = ('_METADATA', '_CHECKPOINT_METADATA', 'manifest.ocdbt')
_LOOPED_LAYER = re.compile(r'DotReluDot_(\d+)$')
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
    framework: 'linen' (a `TrainState`) or 'nnx' (`{'model', 'optimizer'}`).
    layout: 'scan' (stacked layers) or 'loop'.
    num_layers, depth, dtype: of the MLP.
    optimizer: the optimizer whose state it holds ('adam' also covers adamw).
    leaves: `{path: (shape, dtype)}` of every array, keys as strings.
    host_tree: the arrays of an msgpack file, read whole.
    unfinished: an Orbax save that never finished, read on request.
  """

  path: str
  format: str
  framework: Framework
  layout: str
  num_layers: int
  depth: int
  dtype: str
  optimizer: str
  leaves: Leaves
  host_tree: Any = dataclasses.field(default=None, repr=False, compare=False)
  unfinished: bool = False

  @property
  def nbytes(self) -> int:
    return sum(
        int(np.prod(shape)) * np.dtype(dtype).itemsize
        for shape, dtype in self.leaves.values()
    )

  def summary(self) -> dict:
    return {
        'path': self.path, 'format': self.format, 'framework': self.framework,
        'layout': self.layout, 'num_layers': self.num_layers, 'depth': self.depth,
        'dtype': self.dtype, 'optimizer': self.optimizer, 'leaves': len(self.leaves),
        'bytes': self.nbytes,
    }


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


def _ignore_stray_orbax_callbacks() -> None:
  """Keeps TensorStore reads that finish after a failed Orbax read quiet.

  Orbax runs each call on a fresh event loop and closes it as soon as a read
  fails (even when it then logs and returns None); reads still in flight then
  call back into the closed loop, and each callback's
  `RuntimeError('Event loop is closed')` is printed as unraisable, tens of
  tracebacks around the one-line error. Those, and only those, are dropped;
  every other unraisable exception reaches the previous hook. Installed
  before the first Orbax read, since the callbacks can come before it returns.
  """
  previous = sys.unraisablehook
  if getattr(previous, 'ignores_stray_orbax_callbacks', False):
    return

  def hook(unraisable):
    if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == 'Event loop is closed':
      return
    previous(unraisable)

  hook.ignores_stray_orbax_callbacks = True
  sys.unraisablehook = hook


def _step_metadata(path: str) -> Any:
  """Orbax's step metadata (item metadata and commit time); reads no array data."""
  import orbax.checkpoint as ocp

  _ignore_stray_orbax_callbacks()
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


def leaves_of(tree: Any) -> Leaves:
  """`{path: (shape, dtype)}` of every array of `tree` (arrays or their metadata)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {string_path(k): (tuple(v.shape), str(np.dtype(v.dtype))) for k, v in leaves}


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


def _subkeys(leaves: Leaves, prefix: tuple[str, ...]) -> set[str]:
  n = len(prefix)
  return {p[n] for p in leaves if p[:n] == prefix and len(p) > n}


def _shape(leaves: Leaves, path: tuple[str, ...], path_text: str, rank: int) -> tuple[int, ...]:
  """The shape of the kernel at `path`, which must be there with `rank` dimensions."""
  if path not in leaves:
    raise CheckpointError(
        f'{path_text}: missing; this is not a checkpoint of the kit\'s MLP '
        f'(expected the parameter {_join(path)})',
        [_join(path)],
    )
  shape = leaves[path][0]
  if len(shape) != rank:
    raise CheckpointError(
        f'{path_text}: {_join(path)} has shape {shape}, not rank {rank}; this is '
        'not a checkpoint of the kit\'s MLP',
        [_join(path)],
    )
  return shape


def _model_of(leaves: Leaves, framework: Framework, where: str) -> tuple[str, int, int, str]:
  """`(layout, num_layers, depth, dtype)` from the parameter leaves."""
  if framework == 'linen':
    tops = _subkeys(leaves, ('params',))
    if 'ScanDotReluDot_0' in tops:
      kernel = ('params', 'ScanDotReluDot_0', 'Dense_0', 'kernel', 'value')
      shape = _shape(leaves, kernel, where, 3)
      return 'scan', shape[0], shape[-1], leaves[kernel][1]
    kernel = ('params', 'DotReluDot_0', 'Dense_0', 'kernel', 'value')
    count = sum(1 for k in tops if _LOOPED_LAYER.match(k))
  else:
    tops = _subkeys(leaves, ('model', 'layers'))
    if 'dot1' in tops:
      kernel = ('model', 'layers', 'dot1', 'kernel', 'value')
      shape = _shape(leaves, kernel, where, 3)
      return 'scan', shape[0], shape[-1], leaves[kernel][1]
    kernel = ('model', 'layers', '0', 'dot1', 'kernel', 'value')
    count = sum(1 for k in tops if k.isdigit())
  shape = _shape(leaves, kernel, where, 2)
  return 'loop', count, shape[-1], leaves[kernel][1]


def _optimizer_of(leaves: Leaves, framework: Framework, where: str) -> str:
  if framework == 'nnx' and 'momentum' in _subkeys(leaves, ('optimizer',)):
    return 'fsdp_sgd'
  prefix = ('opt_state', '0') if framework == 'linen' else ('optimizer', 'opt_state', '0')
  keys = frozenset(_subkeys(leaves, prefix))
  if keys not in _OPTAX_STATE_KEYS:
    raise CheckpointError(
        f'{where}: {_join(prefix)} holds {sorted(keys)}, not the state of an '
        'optimizer the kit converts (adam or adamw: count, mu, nu; '
        'sgd_momentum: trace; fsdp_sgd: count, ema, or the NNX SGD momentum)',
        [_join(prefix)],
    )
  return _OPTAX_STATE_KEYS[keys]


def inspect(path: str | os.PathLike, allow_unfinished: bool = False) -> CheckpointInfo:
  """Reads what the checkpoint at `path` holds, without its array data.

  Args:
    path: a checkpoint, or a `flax.training.checkpoints` directory.
    allow_unfinished: accept an Orbax save that never finished (its arrays
      may be incomplete).

  Raises:
    CheckpointError: the path is missing, unreadable, an unfinished save, or
      not a training state of the kit's MLP written by either implementation.
  """
  path, format = locate(path)
  host_tree = None
  unfinished = False
  if format == 'orbax':
    step = _step_metadata(path)
    why = unfinished_reason(path, step)
    if why is not None and not allow_unfinished:
      raise CheckpointError(
          f'{path}: an unfinished Orbax save ({why}), so its arrays may be '
          'incomplete; wait for the save to finish, or pass --allow-unfinished '
          '(allow_unfinished=True) to read it anyway'
      )
    unfinished = why is not None
    tree = step.item_metadata.tree  # keeps the empty optax states
    leaves = leaves_of(tree)
  else:
    host_tree = tree = _msgpack_tree(path)
    flat = jax.tree_util.tree_flatten_with_path(host_tree)[0]
    leaves = {
        string_path(k): (tuple(np.shape(v)), str(np.asarray(v).dtype)) for k, v in flat
    }
  tops = {p[0] for p in leaves}
  if {'step', 'params', 'opt_state'} <= tops:
    framework: Framework = 'linen'
  elif {'model', 'optimizer'} <= tops:
    framework = 'nnx'
  else:
    raise CheckpointError(
        f'{path}: top-level keys {sorted(tops)} are neither a Linen TrainState '
        "(step, params, opt_state) nor an NNX training state (model, optimizer); "
        'save the whole training state as linen_impl.checkpoint and '
        'nnx_impl.checkpoint do'
    )
  layout, num_layers, depth, dtype = _model_of(leaves, framework, path)
  optimizer = _optimizer_of(leaves, framework, path)
  if optimizer == 'adam' and framework == 'linen' and len(tree['opt_state']) == 3:
    optimizer = 'adamw'  # chain(scale_by_adam, add_decayed_weights, scale): 3 states
  return CheckpointInfo(
      path, format, framework, layout, num_layers, depth, dtype, optimizer, leaves,
      host_tree, unfinished,
  )


# Optimizers whose states hold the same arrays.
_SAME_STATE = {'adam': 'adam', 'adamw': 'adam', 'sgd_momentum': 'sgd_momentum', 'fsdp_sgd': 'fsdp_sgd'}


def with_optimizer(info: CheckpointInfo, optimizer: str | None) -> CheckpointInfo:
  """`info` with the caller's optimizer, which must keep the same state arrays."""
  if optimizer is None or optimizer == info.optimizer:
    return info
  if _SAME_STATE.get(optimizer) != _SAME_STATE[info.optimizer]:
    raise CheckpointError(
        f'{info.path}: holds the state of {info.optimizer}, which is not the '
        f'state of optimizer={optimizer!r}; drop the option or name the '
        'optimizer the checkpoint was trained with'
    )
  return dataclasses.replace(info, optimizer=optimizer)


def description(
    info: CheckpointInfo,
    mesh_shape: tuple[int, int] = (2, 4),
    annotation: str = 'device',
    rules: tuple = GUIDE_RULES,
    layer_partition: str | None = None,
    layout: str | None = None,
) -> ModelDescription:
  """The `ModelDescription` of the checkpoint's model on `mesh_shape`.

  The annotation style, rules and layer partition are not stored in a
  checkpoint (only arrays are), so they come from the caller.
  `layer_partition` names the stacked layer axis, so it applies only when the
  layout (`layout`, or the checkpoint's own) is scanned; callers converting
  between layouts pass the same name for both sides.
  """
  use_scan = (layout or info.layout) == 'scan'
  return ModelDescription(
      num_layers=info.num_layers,
      depth=info.depth,
      batch=mesh_shape[0],
      use_scan=use_scan,
      layer_partition=layer_partition if use_scan else None,
      annotation=annotation,
      rules=rules,
      mesh_shape=mesh_shape,
      dtype=info.dtype,
  )


def check_layer_partition(layer_partition: str | None, layouts: list[str]) -> None:
  """Raises `CheckpointError` when a layer partition is given with no scanned side."""
  if layer_partition is not None and 'scan' not in layouts:
    raise CheckpointError(
        f'layer_partition={layer_partition!r} names the stacked layer axis, but '
        f'no side is scanned (layouts {layouts}); drop --layer-partition or '
        'convert to --layout scan'
    )


def trainer_for(framework: Framework, desc: ModelDescription, mesh, optimizer: str):
  """The Linen or NNX trainer whose training state a checkpoint holds."""
  if framework == 'linen':
    from linen_impl import train as linen_train

    return linen_train.make_trainer(desc, mesh, make_tx(optimizer))
  from nnx_impl import train as nnx_train

  return nnx_train.make_trainer(desc, mesh, optimizer)


def checkpoint_module(framework: Framework):
  """`linen_impl.checkpoint` or `nnx_impl.checkpoint`: same functions, each side."""
  if framework == 'linen':
    from linen_impl import checkpoint
  else:
    from nnx_impl import checkpoint
  return checkpoint


def restore_target(framework: Framework, trainer) -> Any:
  """The abstract state, with shardings, that `trainer`'s restore fills."""
  return checkpoint_module(framework).restore_target(trainer)


def expected_leaves(framework: Framework, trainer) -> Leaves:
  """`{path: (shape, dtype)}` of what `trainer`'s save writes."""
  return leaves_of(restore_target(framework, trainer))


def check_structure(info: CheckpointInfo, wanted: Leaves) -> None:
  """Raises `CheckpointError` listing every leaf that is missing or differs."""
  missing = sorted(_join(p) for p in set(wanted) - set(info.leaves))
  extra = sorted(_join(p) for p in set(info.leaves) - set(wanted))
  differing = sorted(
      f'{_join(p)} {info.leaves[p][0]} {info.leaves[p][1]} (expected {w[0]} {w[1]})'
      for p, w in wanted.items()
      if p in info.leaves and info.leaves[p] != w
  )
  if missing or extra or differing:
    raise CheckpointError(
        f'{info.path}: does not hold the {info.framework} training state of a '
        f'{info.num_layers}-layer, depth-{info.depth} MLP with {info.optimizer}: '
        f'missing [{format_offenders(missing)}], unexpected '
        f'[{format_offenders(extra)}], shape or dtype differs '
        f'[{format_offenders(differing)}]',
        missing + extra + differing,
    )


def restore(info: CheckpointInfo, trainer) -> Any:
  """The checkpoint read into `trainer`'s shardings (a `TrainState` or `nnx.State`).

  What the implementation's `restore` returns, with Orbax reading at most
  `RESTORE_CONCURRENT_GB` at a time. Call with the trainer's mesh in context
  (`jax.set_mesh`).
  """
  import orbax.checkpoint as ocp
  from etils import epath

  target = restore_target(info.framework, trainer)
  if info.format == 'flax-msgpack':
    return _place_host_tree(info, target)
  handler = ocp.StandardCheckpointHandler(restore_concurrent_gb=RESTORE_CONCURRENT_GB)
  _ignore_stray_orbax_callbacks()
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


def _place_host_tree(info: CheckpointInfo, target) -> Any:
  flat = {
      string_path(k): v for k, v in jax.tree_util.tree_flatten_with_path(info.host_tree)[0]
  }

  def place(keypath, abstract):
    value = np.asarray(flat[string_path(keypath)])
    return jax.device_put(value, abstract.sharding)  # each device gets its shards

  return jax.tree_util.tree_map_with_path(place, target)
