"""`linen_to_nnx` and `nnx_to_linen`: parameters, optimizer state and metadata.

Linen side: a boxed variables dict `{'params': ...}` or a `TrainState`. NNX
side: an `nnx.State` of `nnx.Param`s (what `nnx.update(model, state)` takes),
a model, or a `(model, optimizer)` pair. Converting optimizer state needs the
other side's structure, given as `target`: an NNX `(model, optimizer)` (real
or from `nnx.eval_shape`) or a Linen `TrainState` (real or from
`jax.eval_shape`). Targets are templates only: they are never modified, and
their annotations must agree with the converted ones.

Optimizer states map leaf by leaf: an optax state inside a `TrainState`
corresponds to `nnx.Optimizer.opt_state` under the same keys (`0/mu/...`), with
each moment tree converted exactly like the parameters; the FSDP example's
hand-written SGD (`nnx_impl.sgd.SGD`) corresponds to `optax.chain(optax.ema(
decay, debias=False), optax.scale(-lr))`, its `momentum` to the `ema` trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from converters import layout
from converters import metadata as md
from converters.errors import (
    AnnotationError,
    OptimizerStateError,
    ShapeError,
    StructureError,
    format_offenders,
)
from converters.paths import KIT_PATHS, Framework, PathMapping, format_path


@dataclasses.dataclass(frozen=True)
class Options:
  """What every conversion is told: see `linen_to_nnx`."""

  paths: PathMapping = KIT_PATHS
  scan: bool | None = None
  layer_partition: str | None = None
  num_layers: int | None = None
  mesh: Mesh | None = None
  rules: tuple | None = None


# -- reading each side -------------------------------------------------------------


def _key(k) -> Any:
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return getattr(k, attr)
  raise StructureError(f'unsupported pytree key {k!r}')


def _keys(keypath) -> tuple:
  return tuple(_key(k) for k in keypath)


def read_linen_tree(
    tree, where: str, uniform: bool = True
) -> dict[tuple, tuple[Any, md.Annotation]]:
  """`{path: (array, annotation)}` of a boxed Linen tree.

  With `uniform`, a tree whose leaves are partly boxed is rejected.
  """
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=md.is_linen_box)[0]
  flat = {}
  for keypath, leaf in leaves:
    path = _keys(keypath)
    flat[path] = md.read_linen(leaf, f'{where}/{format_path(path)}')
  boxed = [p for p, (_, a) in flat.items() if a.names is not None]
  unboxed = [format_path(p) for p, (_, a) in flat.items() if a.names is None]
  if uniform and boxed and unboxed:
    raise AnnotationError(
        f'{where}: some parameters are boxed (e.g. {format_path(boxed[0])}) but '
        f'these are bare arrays: {format_offenders(unboxed)}; annotate them too '
        '(nn.with_partitioning(init, (None,) * ndim)) so no sharding is guessed',
        unboxed,
    )
  return flat


def read_nnx_state(state, where: str, only: type | None = None) -> dict[tuple, tuple[Any, md.Annotation, nnx.Variable]]:
  """`{path: (array, annotation, variable)}` of an `nnx.State`."""
  flat = {}
  wrong = []
  for path, variable in nnx.to_flat_state(state):
    if not isinstance(variable, nnx.Variable):
      raise StructureError(f'{where}/{format_path(path)}: not an nnx.Variable', [format_path(path)])
    if only is not None and not isinstance(variable, only):
      wrong.append(f'{format_path(path)} ({type(variable).__name__})')
      continue
    value, annotation = md.read_nnx(variable, f'{where}/{format_path(path)}')
    flat[tuple(path)] = (value, annotation, variable)
  if wrong:
    raise StructureError(
        f'{where}: only nnx.Param parameters are converted, found '
        f'{format_offenders(wrong)}; split them off first '
        '(nnx.state(model, nnx.Param))',
        wrong,
    )
  return flat


# -- parameters ----------------------------------------------------------------------


def _convert_flat(flat, source: Framework, target: Framework, options: Options):
  """`{target path: (array, annotation)}` for a flat tree of one side."""
  pairs = {p: (v[0], v[1]) for p, v in flat.items()}
  targets = layout.plan(
      pairs, options.paths, source, target,
      options.scan, options.layer_partition, options.num_layers,
  )
  shardings = layout.target_shardings(targets, pairs, options.mesh, options.rules)
  arrays = layout.execute(targets, pairs, shardings)
  return {p: (arrays[p], targets[p].annotation) for p in targets}


def _nest(flat: Mapping[tuple, Any]) -> dict:
  root: dict = {}
  for path, value in flat.items():
    node = root
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return root


# -- optimizer state ----------------------------------------------------------------


def _split_param_suffix(path: tuple, param_paths: set[tuple]) -> tuple[tuple, tuple | None]:
  for i in range(len(path)):
    if path[i:] in param_paths:
      return path[:i], path[i:]
  return path, None


@dataclasses.dataclass(frozen=True)
class _OptimizerCorrespondence:
  """How Linen optax-state prefixes map to NNX optimizer-state prefixes."""

  name: str
  to_nnx: Mapping[tuple, tuple] | None  # None: ('opt_state',) + prefix
  derived_from_step: tuple[tuple, ...] = ()  # Linen leaves equal to the step

  def nnx_prefix(self, linen_prefix: tuple) -> tuple | None:
    if self.to_nnx is None:
      return ('opt_state',) + linen_prefix
    return self.to_nnx.get(linen_prefix)

  def linen_prefix(self, nnx_prefix: tuple) -> tuple | None:
    if self.to_nnx is None:
      return nnx_prefix[1:] if nnx_prefix[:1] == ('opt_state',) else None
    return {v: k for k, v in self.to_nnx.items()}.get(nnx_prefix)


_OPTAX = _OptimizerCorrespondence('nnx.Optimizer', None)
_FSDP_SGD = _OptimizerCorrespondence(
    'SGD (NNX FSDP example)', {(0, 'ema'): ('momentum',)}, derived_from_step=((0, 'count'),)
)


def _correspondence(optimizer) -> _OptimizerCorrespondence:
  if isinstance(optimizer, nnx.Optimizer):
    return _OPTAX
  from nnx_impl.sgd import SGD

  if isinstance(optimizer, SGD):
    return _FSDP_SGD
  raise OptimizerStateError(
      f'optimizer of type {type(optimizer).__name__} has a state structure the '
      'converters do not know; use nnx.Optimizer(model, tx, wrt=nnx.Param) or '
      'nnx_impl.sgd.SGD'
  )


def _scalar_like(value, template_dtype, mesh: Mesh | None, where: str):
  """A step or count converted to the other side's integer dtype."""
  if not np.issubdtype(np.dtype(template_dtype), np.integer) or np.ndim(value) != 0:
    raise ShapeError(f'{where}: expected an integer scalar, found {np.shape(value)}', [where])
  if isinstance(value, jax.Array):
    return value if value.dtype == template_dtype else value.astype(template_dtype)
  array = np.asarray(value, dtype=template_dtype)
  return jax.device_put(array, NamedSharding(mesh, PartitionSpec())) if mesh else jnp.asarray(array)


def _mesh_of_tree(flat) -> Mesh | None:
  for value, *_ in flat.values():
    sharding = getattr(value, 'sharding', None)
    if isinstance(sharding, NamedSharding):
      return sharding.mesh
  return None


def _check_against_template(path: str, value, annotation, t_value, t_annotation):
  if tuple(value.shape) != tuple(t_value.shape):
    raise ShapeError(
        f'{path}: converted shape {tuple(value.shape)}, target expects '
        f'{tuple(t_value.shape)}; convert with the target layout (scan=..., '
        'num_layers=...) or build the target from the same model description',
        [path],
    )
  if value.dtype != t_value.dtype:
    raise ShapeError(
        f'{path}: converted dtype {value.dtype}, target expects {t_value.dtype}; '
        'cast the source or build the target with the same dtype',
        [path],
    )
  if t_annotation is not None and (
      (annotation.names, annotation.rules) != (t_annotation.names, t_annotation.rules)
  ):
    raise AnnotationError(
        f'{path}: converted annotation names={annotation.names} '
        f'rules={annotation.rules}, target has names={t_annotation.names} '
        f'rules={t_annotation.rules}; build the target with the same '
        'annotations (or convert with layer_partition=... to match it)',
        [path],
    )


def _check_keys(where: str, wanted, given):
  missing = sorted(format_path(p) for p in set(wanted) - set(given))
  unexpected = sorted(format_path(p) for p in set(given) - set(wanted))
  if missing or unexpected:
    offenders = missing + unexpected
    in_optimizer = all(p.startswith(('optimizer/', 'opt_state')) for p in offenders)
    error = OptimizerStateError if in_optimizer or 'opt_state' in where else StructureError
    raise error(
        f'{where}: the source lacks [{format_offenders(missing)}] and has '
        f'[{format_offenders(unexpected)}] that the target lacks; convert '
        'between models of the same description (same layers, optimizer and '
        'layout)',
        missing + unexpected,
    )


# -- public API ------------------------------------------------------------------------


def linen_to_nnx(
    linen: Mapping | TrainState,
    *,
    target: Any = None,
    paths: PathMapping = KIT_PATHS,
    scan: bool | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
):
  """Converts Linen variables or a `TrainState` to NNX.

  Args:
    linen: `{'params': boxed params}` or a `TrainState` with boxed params.
    target: NNX structure to fill: a model, or `(model, optimizer)` (needed for
      a `TrainState`); real or abstract (`nnx.eval_shape`). Not modified.
    paths: the Linen <-> NNX path mapping.
    scan: target layout of layer parameters (True stacked, False looped,
      None as the source).
    layer_partition: layer axis name inserted when stacking.
    num_layers: expected number of layers (checked; inferred when None).
    mesh: the mesh of arrays that carry no `NamedSharding` (abstract trees).
    rules: logical rules for logical boxes that carry none.

  Returns:
    Without `target`: an `nnx.State` of `nnx.Param`s (for `nnx.update`).
    With a model target: a new model; with `(model, optimizer)`: a new pair.
    Arrays whose layout does not change are the input arrays (no copy).

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules)
  is_state = isinstance(linen, TrainState)
  params = linen.params if is_state else linen.get('params') if isinstance(linen, Mapping) else None
  if params is None:
    raise StructureError(
        "linen input must be a TrainState or a variables dict with a 'params' "
        f'collection, got {type(linen).__name__}'
    )
  if not is_state and set(linen) != {'params'}:
    others = sorted(set(linen) - {'params'})
    raise StructureError(
        f'collections {others} are not converted; pass {{"params": ...}} only',
        others,
    )
  param_flat = read_linen_tree(params, 'params')
  converted = _convert_flat(param_flat, 'linen', 'nnx', options)

  if is_state and (not isinstance(target, tuple) or len(target) != 2):
    raise StructureError(
        'converting a TrainState needs target=(model, optimizer): the NNX '
        'optimizer whose state structure to fill (real, or from nnx.eval_shape)'
    )
  if target is None:
    return nnx.State(_nest({p: md.write_nnx(nnx.Param, v, a) for p, (v, a) in converted.items()}))

  model, optimizer = target if isinstance(target, tuple) else (target, None)
  graphdef, template = nnx.split({'model': model, 'optimizer': optimizer} if optimizer is not None else {'model': model})
  template_flat = read_nnx_state(template, 'target')
  produced = {('model',) + p: va for p, va in converted.items()}

  if optimizer is not None:
    if not is_state:
      raise StructureError('target has an optimizer but the Linen input has no opt_state; pass a TrainState')
    produced.update(_linen_opt_to_nnx(linen, param_flat, optimizer, template_flat, options))
  _check_keys('linen -> nnx', [p for p in template_flat], produced)

  new_flat = {}
  for path, (t_value, t_annotation, t_var) in template_flat.items():
    value, annotation = produced[path]
    where = format_path(path)
    if annotation is None:  # a step or count: the target's own metadata
      value = _scalar_like(value, t_value.dtype, options.mesh or _mesh_of_tree(template_flat), where)
      new_flat[path] = t_var.replace(value)
      continue
    _check_against_template(where, value, annotation, t_value, t_annotation)
    new_var = t_var.replace(value)
    for key, extra in annotation.extra:
      new_var.set_metadata(key, extra)
    new_flat[path] = new_var
  objects = nnx.merge(graphdef, nnx.State(_nest(new_flat)))
  return (objects['model'], objects['optimizer']) if optimizer is not None else objects['model']


def _linen_opt_to_nnx(state: TrainState, param_flat, optimizer, template_flat, options):
  """`{nnx path: (value, annotation or None)}` of the optimizer part."""
  corr = _correspondence(optimizer)
  param_paths = set(param_flat)
  opt_flat = read_linen_tree(state.opt_state, 'opt_state', uniform=False)
  groups: dict[tuple, dict] = {}
  scalars: dict[tuple, Any] = {}
  for path, (value, annotation) in opt_flat.items():
    prefix, param = _split_param_suffix(path, param_paths)
    if param is None:
      scalars[path] = value
    else:
      groups.setdefault(prefix, {})[param] = (value, annotation)
  out = {('optimizer', 'step'): (state.step, None)}
  unknown = []
  for prefix, flat in groups.items():
    nnx_prefix = corr.nnx_prefix(prefix)
    if nnx_prefix is None:
      unknown.append(format_path(prefix))
      continue
    for p, va in _convert_flat(flat, 'linen', 'nnx', options).items():
      out[('optimizer',) + nnx_prefix + p] = va
  for path, value in scalars.items():
    if path in corr.derived_from_step:
      if np.asarray(value) != np.asarray(state.step):
        raise OptimizerStateError(
            f'opt_state/{format_path(path)}={np.asarray(value)} differs from '
            f'step={np.asarray(state.step)}; {corr.name} keeps only the step, '
            'so this state cannot be converted without loss',
            [format_path(path)],
        )
      continue
    nnx_prefix = corr.nnx_prefix(path)
    if nnx_prefix is None:
      unknown.append(format_path(path))
      continue
    out[('optimizer',) + nnx_prefix] = (value, None)
  if unknown:
    raise OptimizerStateError(
        f'opt_state leaves with no counterpart in {corr.name}: '
        f'{format_offenders(unknown)}; the Linen optimizer and the NNX '
        'optimizer must use the same optax transform',
        unknown,
    )
  return out


def nnx_to_linen(
    nnx_in,
    *,
    target: TrainState | None = None,
    paths: PathMapping = KIT_PATHS,
    scan: bool | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
):
  """Converts an NNX state, model or `(model, optimizer)` to Linen.

  Args:
    nnx_in: an `nnx.State` of `nnx.Param`s, a model, or `(model, optimizer)`.
    target: a `TrainState` (real, or from `jax.eval_shape`) whose `tx`,
      `apply_fn` and `opt_state` structure to fill; needed with an optimizer.
      Not modified.
    paths, scan, layer_partition, num_layers, mesh, rules: as in
      `linen_to_nnx`.

  Returns:
    Without an optimizer: `{'params': boxed params}`. With one: a new
    `TrainState`. Arrays whose layout does not change are the input arrays.

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules)
  optimizer = None
  if isinstance(nnx_in, tuple):
    if len(nnx_in) != 2:
      raise StructureError('pass an nnx.State, a model, or (model, optimizer)')
    model, optimizer = nnx_in
    state = nnx.state(model)
  elif isinstance(nnx_in, nnx.Module):
    state = nnx.state(nnx_in)
  elif isinstance(nnx_in, nnx.State):
    state = nnx_in
  else:
    raise StructureError(
        f'nnx input must be an nnx.State, a model or (model, optimizer), got '
        f'{type(nnx_in).__name__}'
    )
  param_flat = read_nnx_state(state, 'model', only=nnx.Param)
  converted = _convert_flat(param_flat, 'nnx', 'linen', options)
  params = _nest({p: md.write_linen(v, a) for p, (v, a) in converted.items()})
  if optimizer is None:
    if target is not None:
      raise StructureError('a TrainState target needs (model, optimizer) as input')
    return {'params': params}
  if not isinstance(target, TrainState):
    raise StructureError(
        'converting an optimizer needs target=TrainState (real, or from '
        'jax.eval_shape of your init) for its tx and opt_state structure'
    )
  template_params = read_linen_tree(target.params, 'target.params')
  _check_keys('nnx -> linen params', template_params, converted)
  for p, (value, annotation) in converted.items():
    t_value, t_annotation = template_params[p]
    _check_against_template('params/' + format_path(p), value, annotation, t_value, t_annotation)

  corr = _correspondence(optimizer)
  opt_flat = read_nnx_state(nnx.state(optimizer), 'optimizer')
  nnx_param_paths = {p for p in param_flat}
  step = None
  groups: dict[tuple, dict] = {}
  scalars: dict[tuple, Any] = {}
  for path, (value, annotation, _) in opt_flat.items():
    if path == ('step',):
      step = value
      continue
    prefix, param = _split_param_suffix(path, nnx_param_paths)
    if param is None:
      scalars[path] = value
    else:
      groups.setdefault(prefix, {})[param] = (value, annotation, None)
  produced: dict[tuple, tuple[Any, md.Annotation | None]] = {}
  unknown = []
  for prefix, flat in groups.items():
    linen_prefix = corr.linen_prefix(prefix)
    if linen_prefix is None:
      unknown.append(format_path(prefix))
      continue
    for p, va in _convert_flat(flat, 'nnx', 'linen', options).items():
      produced[linen_prefix + p] = va
  for path, value in scalars.items():
    linen_prefix = corr.linen_prefix(path)
    if linen_prefix is None:
      unknown.append(format_path(path))
      continue
    produced[linen_prefix] = (value, None)
  for path in corr.derived_from_step:
    produced[path] = (step, None)
  if unknown:
    raise OptimizerStateError(
        f'optimizer leaves with no counterpart in an optax state: '
        f'{format_offenders(unknown)}',
        unknown,
    )
  t_leaves, treedef = jax.tree_util.tree_flatten_with_path(target.opt_state, is_leaf=md.is_linen_box)
  t_paths = [_keys(k) for k, _ in t_leaves]
  _check_keys('nnx -> linen opt_state', t_paths, produced)
  mesh_hint = options.mesh or _mesh_of_tree(param_flat)
  leaves = []
  for path, (_, t_leaf) in zip(t_paths, t_leaves):
    t_value, t_annotation = md.read_linen(t_leaf, 'target.opt_state/' + format_path(path))
    t_annotation = t_annotation if md.is_linen_box(t_leaf) else None
    value, annotation = produced[path]
    where = 'opt_state/' + format_path(path)
    if annotation is None:
      leaves.append(_scalar_like(value, t_value.dtype, mesh_hint, where))
      continue
    _check_against_template(where, value, annotation, t_value, t_annotation)
    leaves.append(md.write_linen(value, annotation))
  opt_state = jax.tree.unflatten(treedef, leaves)
  step_dtype = getattr(target.step, 'dtype', np.dtype('int32'))
  return target.replace(
      step=_scalar_like(step, step_dtype, mesh_hint, 'step'),
      params=params,
      opt_state=opt_state,
  )
