"""Framework trees as flat maps, and the checks every conversion shares.

`read_linen_tree` and `read_nnx_state` turn a boxed Linen tree or an
`nnx.State` into `{path: (array, Annotation, ...)}`; `convert_flat` runs path
translation and relayout on such a map (`converters.layout`); `nest` builds
nested dicts back. `check_keys` and `check_against_template` compare a
conversion with the target structure it fills, and `scalar_like` converts step
counters between Linen's and NNX's integer dtypes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
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
  donate: bool = False


# -- reading each side -------------------------------------------------------------


def key_of(k) -> Any:
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return getattr(k, attr)
  raise StructureError(f'unsupported pytree key {k!r}')


def keys_of(keypath) -> tuple:
  return tuple(key_of(k) for k in keypath)


def read_linen_tree(
    tree, where: str, uniform: bool = True
) -> dict[tuple, tuple[Any, md.Annotation]]:
  """`{path: (array, annotation)}` of a boxed Linen tree.

  With `uniform`, a tree whose leaves are partly boxed is rejected.
  """
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=md.is_linen_box)[0]
  flat = {}
  for keypath, leaf in leaves:
    path = keys_of(keypath)
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


def convert_flat(flat, source: Framework, target: Framework, options: Options):
  """`{target path: (array, annotation)}` for a flat tree of one side."""
  pairs = {p: (v[0], v[1]) for p, v in flat.items()}
  if jax.process_count() > 1:
    agree_on_conversion(pairs, source, target, options)
  targets = layout.plan(
      pairs, options.paths, source, target,
      options.scan, options.layer_partition, options.num_layers,
  )
  shardings = layout.target_shardings(targets, pairs, options.mesh, options.rules)
  arrays = layout.execute(targets, pairs, shardings, options.donate)
  return {p: (arrays[p], targets[p].annotation) for p in targets}


def agree_on_conversion(pairs, source: Framework, target: Framework, options: Options) -> None:
  """Every process converts the same tree the same way (see `converters.processes`)."""
  from converters.processes import agree

  agree(
      f'{source} -> {target} conversion',
      {
          'options': {
              'scan': options.scan, 'layer_partition': options.layer_partition,
              'num_layers': options.num_layers,
          },
          'leaves': {
              format_path(p): [list(v.shape), str(v.dtype), repr(a.names), repr(a.rules)]
              for p, (v, a) in pairs.items()
          },
      },
  )


def nest(flat: Mapping[tuple, Any]) -> dict:
  root: dict = {}
  for path, value in flat.items():
    node = root
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return root


def scalar_like(value, template_dtype, mesh: Mesh | None, where: str):
  """A step or count converted to the other side's integer dtype."""
  if not np.issubdtype(np.dtype(template_dtype), np.integer) or np.ndim(value) != 0:
    raise ShapeError(f'{where}: expected an integer scalar, found {np.shape(value)}', [where])
  if isinstance(value, jax.Array):
    return value if value.dtype == template_dtype else value.astype(template_dtype)
  array = np.asarray(value, dtype=template_dtype)
  return jax.device_put(array, NamedSharding(mesh, PartitionSpec())) if mesh else jnp.asarray(array)


def mesh_of_tree(flat) -> Mesh | None:
  for value, *_ in flat.values():
    sharding = getattr(value, 'sharding', None)
    if isinstance(sharding, NamedSharding):
      return sharding.mesh
  return None


def check_against_template(path: str, value, annotation, t_value, t_annotation):
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


def check_keys(where: str, wanted, given):
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
