"""`linen_to_nnx` and `nnx_to_linen`: parameters, optimizer state and metadata.

Linen side: a boxed variables dict `{'params': ...}` or a `TrainState`. NNX
side: an `nnx.State` of `nnx.Param`s (what `nnx.update(model, state)` takes),
a model, or a `(model, optimizer)` pair. Converting optimizer state needs the
other side's structure, given as `target`: an NNX `(model, optimizer)` (real
or from `nnx.eval_shape`) or a Linen `TrainState` (real or from
`jax.eval_shape`). Targets are templates only: they are never modified, and
their annotations must agree with the converted ones.

How optimizer states correspond is in `converters.optimizer_state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import Mesh

from converters import metadata as md
from converters.errors import AnnotationError, StructureError
from converters.optimizer_state import linen_opt_to_nnx, nnx_opt_to_linen
from converters.paths import PathMapping, format_path
from converters.tree_io import (
    Batch,
    Options,
    check_against_template,
    check_keys,
    convert_flat,
    mesh_of_tree,
    nest,
    read_linen_tree,
    read_nnx_state,
    scalar_like,
)


def linen_to_nnx(
    linen: Mapping | TrainState,
    *,
    target: Any = None,
    paths: PathMapping | None = None,
    scan: bool | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
    donate: bool = False,
):
  """Converts Linen variables or a `TrainState` to NNX.

  Args:
    linen: `{'params': boxed params}` or a `TrainState` with boxed params.
    target: NNX structure to fill: a model, or `(model, optimizer)` (needed for
      a `TrainState`); real or abstract (`nnx.eval_shape`). Not modified.
    paths: the Linen <-> NNX path mapping: a `PathMapping` or any iterable
      of `PathRule`s; None keeps every parameter's path
      (`PathMapping.identity()`).
    scan: target layout of layer parameters (True stacked, False looped,
      None as the source).
    layer_partition: layer axis name inserted when stacking.
    num_layers: expected number of layers, checked in every layout
      (inferred when None).
    mesh: the mesh of arrays that carry no `NamedSharding` (abstract trees).
    rules: logical rules for logical boxes that carry none; attached to the
      output (as `sharding_rules` / the box's rules) so it resolves alone.
    donate: delete each input array that is relaid (stacked or sliced) as
      soon as its replacement exists, so a relayout holds one group of layers
      twice instead of the whole tree. The input must not be used afterwards.
      Every check runs before any array is deleted; only a failure while the
      arrays are being built (out of memory) can leave some deleted. Arrays
      whose layout does not change are never deleted (they are the output's),
      nor is any buffer that two input leaves share (tied weights).

  Every placed input array must sit where its annotation says, and a
  target's arrays must live on the input's mesh: the conversion checks, it
  never reshards.

  Returns:
    Without `target`: an `nnx.State` of `nnx.Param`s (for `nnx.update`).
    With a model target: a new model; with `(model, optimizer)`: a new pair.
    Arrays whose layout does not change are the input arrays (no copy).

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules, donate)
  is_state = isinstance(linen, TrainState)
  if is_state:
    params = linen.params
  else:
    params = linen.get('params') if isinstance(linen, Mapping) else None
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
  if is_state and (not isinstance(target, tuple) or len(target) != 2):
    raise StructureError(
        'converting a TrainState needs target=(model, optimizer): the NNX '
        'optimizer whose state structure to fill (real, or from nnx.eval_shape)'
    )
  if not is_state and isinstance(target, tuple):
    raise StructureError(
        'target has an optimizer but the Linen input has no opt_state; pass a '
        'TrainState, or a model alone as target'
    )
  model, optimizer = target if is_state else (target, None)
  if target is not None and not isinstance(model, nnx.Module):
    raise StructureError(
        f'target model is a {type(model).__name__}; pass an nnx.Module (real, or '
        'from nnx.eval_shape)'
    )
  batch = Batch(options)
  param_flat = _nonempty(read_linen_tree(params, 'params'), 'params')
  converted = batch.plan(param_flat, 'linen', 'nnx')
  if target is None:
    batch.run()
    params = {
        p: md.write_nnx(nnx.Param, batch.value(v), a) for p, (v, a) in converted.items()
    }
    return nnx.State(nest(params))

  objects = {'model': model} if optimizer is None else {'model': model, 'optimizer': optimizer}
  graphdef, template = nnx.split(objects)
  template_flat = read_nnx_state(template, 'target')
  produced = {('model',) + p: va for p, va in converted.items()}
  if optimizer is not None:
    produced.update(linen_opt_to_nnx(linen, param_flat, optimizer, batch))
  check_keys('linen -> nnx', template_flat, produced)

  # Every check passes before any array is built (or any donated one deleted).
  scalars = {}
  for path, (t_value, t_annotation, t_var) in template_flat.items():
    value, annotation = produced[path]
    where = format_path(path)
    if annotation is None:  # a step or count: the target's own metadata
      mesh = options.mesh or mesh_of_tree(template_flat)
      scalars[path] = scalar_like(value, t_value.dtype, mesh, where)
    else:
      check_against_template(where, value, annotation, t_value, t_annotation, options.rules)
      _check_fills(where, t_var, t_value, annotation)
  batch.protect(value for value, annotation in produced.values() if annotation is None)
  batch.run()

  new_flat = {}
  for path, (_, _, t_var) in template_flat.items():
    if path in scalars:
      new_flat[path] = t_var.replace(scalars[path])
      continue
    value, annotation = produced[path]
    new_var = t_var.replace(batch.value(value))
    for key, extra in annotation.extra:
      new_var.set_metadata(key, extra)
    new_flat[path] = new_var
  objects = nnx.merge(graphdef, nnx.State(nest(new_flat)))
  return (objects['model'], objects['optimizer']) if optimizer is not None else objects['model']


def _check_fills(where: str, t_var: nnx.Variable, t_value, annotation: md.Annotation) -> None:
  """The target Variable takes the annotation's extra metadata."""
  try:
    probe = t_var.replace(jax.ShapeDtypeStruct(t_value.shape, t_value.dtype))
    for key, extra in annotation.extra:
      probe.set_metadata(key, extra)
  except (ValueError, TypeError, AttributeError) as e:
    raise AnnotationError(
        f'{where}: the target Variable refuses the metadata '
        f'{dict(annotation.extra)}: {e}; drop or rename those metadata keys',
        [where],
    ) from e


def _nonempty(flat: dict, where: str) -> dict:
  if not flat:
    raise StructureError(
        f'{where}: holds no parameters; pass the model\'s parameters (an empty '
        'tree converts to nothing)',
        [where],
    )
  return flat


def nnx_to_linen(
    nnx_in,
    *,
    target: TrainState | None = None,
    paths: PathMapping | None = None,
    scan: bool | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
    donate: bool = False,
):
  """Converts an NNX state, model or `(model, optimizer)` to Linen.

  Args:
    nnx_in: an `nnx.State` of `nnx.Param`s, a model, or `(model, optimizer)`.
    target: a `TrainState` (real, or from `jax.eval_shape`) whose `tx`,
      `apply_fn` and `opt_state` structure to fill; needed with an optimizer.
      Not modified.
    paths, scan, layer_partition, num_layers, mesh, rules, donate: as in
      `linen_to_nnx`.

  Returns:
    Without an optimizer: `{'params': boxed params}`. With one: a new
    `TrainState`. Arrays whose layout does not change are the input arrays.

  Raises:
    ConversionError: before anything is built, naming every offending path.
  """
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules, donate)
  optimizer = None
  if isinstance(nnx_in, tuple):
    if len(nnx_in) != 2 or not isinstance(nnx_in[0], nnx.Module) or nnx_in[1] is None:
      raise StructureError(
          'pass an nnx.State, a model, or (model, optimizer) with both present, got '
          f'({", ".join(type(x).__name__ for x in nnx_in)})'
      )
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
  if optimizer is None and target is not None:
    raise StructureError('a TrainState target needs (model, optimizer) as input')
  if optimizer is not None and not isinstance(target, TrainState):
    raise StructureError(
        'converting an optimizer needs target=TrainState (real, or from '
        'jax.eval_shape of your init) for its tx and opt_state structure'
    )
  batch = Batch(options)
  param_flat = _nonempty(read_nnx_state(state, 'model', only=nnx.Param), 'model')
  converted = batch.plan(param_flat, 'nnx', 'linen')
  if optimizer is None:
    batch.run()
    return {'params': nest({p: md.write_linen(batch.value(v), a) for p, (v, a) in converted.items()})}
  template_params = read_linen_tree(target.params, 'target.params')
  check_keys('nnx -> linen params', template_params, converted)
  for p, (value, annotation) in converted.items():
    t_value, t_annotation = template_params[p]
    check_against_template(
        'params/' + format_path(p), value, annotation, t_value, t_annotation, options.rules
    )

  mesh_hint = options.mesh or mesh_of_tree(param_flat)
  # Checks the optimizer state against the target, then builds every array.
  step, opt_state = nnx_opt_to_linen(optimizer, param_flat, target, batch, mesh_hint)
  params = nest({p: md.write_linen(batch.value(v), a) for p, (v, a) in converted.items()})
  return target.replace(step=step, params=params, opt_state=opt_state)


def relayout(
    tree,
    *,
    scan: bool,
    paths: PathMapping | None = None,
    layer_partition: str | None = None,
    num_layers: int | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
    donate: bool = False,
):
  """Scanned <-> looped within one framework, for parameters.

  Args:
    tree: Linen `{'params': boxed params}` or an NNX `nnx.State` of Params.
    scan: True to stack the layers, False to unstack them.
    paths, layer_partition, num_layers, mesh, rules, donate: as in
      `linen_to_nnx`.

  Returns:
    The same kind of tree in the other layout. For a whole training state,
    convert through the other framework with targets in the wanted layout.
  """
  options = Options(paths, scan, layer_partition, num_layers, mesh, rules, donate)
  if isinstance(tree, nnx.State):
    flat = _nonempty(read_nnx_state(tree, 'model', only=nnx.Param), 'model')
    converted = convert_flat(flat, 'nnx', 'nnx', options)
    return nnx.State(
        nest({p: md.write_nnx(nnx.Param, v, a) for p, (v, a) in converted.items()})
    )
  if isinstance(tree, Mapping) and set(tree) == {'params'}:
    flat = _nonempty(read_linen_tree(tree['params'], 'params'), 'params')
    converted = convert_flat(flat, 'linen', 'linen', options)
    return {'params': nest({p: md.write_linen(v, a) for p, (v, a) in converted.items()})}
  raise StructureError(
      "relayout takes Linen {'params': ...} or an nnx.State of Params, got "
      f'{type(tree).__name__}'
  )
