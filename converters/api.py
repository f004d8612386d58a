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

from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import Mesh

from converters import metadata as md
from converters.errors import StructureError
from converters.optimizer_state import linen_opt_to_nnx, nnx_opt_to_linen
from converters.paths import KIT_PATHS, PathMapping, format_path
from converters.tree_io import (
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
    paths: PathMapping = KIT_PATHS,
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
    paths: the Linen <-> NNX path mapping.
    scan: target layout of layer parameters (True stacked, False looped,
      None as the source).
    layer_partition: layer axis name inserted when stacking.
    num_layers: expected number of layers (checked; inferred when None).
    mesh: the mesh of arrays that carry no `NamedSharding` (abstract trees).
    rules: logical rules for logical boxes that carry none.
    donate: delete each input array that is relaid (stacked or sliced) as
      soon as its replacement exists, so a relayout holds one group of layers
      twice instead of the whole tree. The input must not be used afterwards;
      if the conversion fails part way, some of its arrays may be deleted.
      Arrays whose layout does not change are never deleted (they are the
      output's).

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
  param_flat = read_linen_tree(params, 'params')
  converted = convert_flat(param_flat, 'linen', 'nnx', options)
  if target is None:
    params = {p: md.write_nnx(nnx.Param, v, a) for p, (v, a) in converted.items()}
    return nnx.State(nest(params))

  model, optimizer = target if is_state else (target, None)
  objects = {'model': model} if optimizer is None else {'model': model, 'optimizer': optimizer}
  graphdef, template = nnx.split(objects)
  template_flat = read_nnx_state(template, 'target')
  produced = {('model',) + p: va for p, va in converted.items()}
  if optimizer is not None:
    produced.update(linen_opt_to_nnx(linen, param_flat, optimizer, options))
  check_keys('linen -> nnx', template_flat, produced)

  new_flat = {}
  for path, (t_value, t_annotation, t_var) in template_flat.items():
    value, annotation = produced[path]
    where = format_path(path)
    if annotation is None:  # a step or count: the target's own metadata
      mesh = options.mesh or mesh_of_tree(template_flat)
      value = scalar_like(value, t_value.dtype, mesh, where)
      new_flat[path] = t_var.replace(value)
      continue
    check_against_template(where, value, annotation, t_value, t_annotation)
    new_var = t_var.replace(value)
    for key, extra in annotation.extra:
      new_var.set_metadata(key, extra)
    new_flat[path] = new_var
  objects = nnx.merge(graphdef, nnx.State(nest(new_flat)))
  return (objects['model'], objects['optimizer']) if optimizer is not None else objects['model']


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
  if optimizer is None and target is not None:
    raise StructureError('a TrainState target needs (model, optimizer) as input')
  if optimizer is not None and not isinstance(target, TrainState):
    raise StructureError(
        'converting an optimizer needs target=TrainState (real, or from '
        'jax.eval_shape of your init) for its tx and opt_state structure'
    )
  param_flat = read_nnx_state(state, 'model', only=nnx.Param)
  converted = convert_flat(param_flat, 'nnx', 'linen', options)
  params = nest({p: md.write_linen(v, a) for p, (v, a) in converted.items()})
  if optimizer is None:
    return {'params': params}
  template_params = read_linen_tree(target.params, 'target.params')
  check_keys('nnx -> linen params', template_params, converted)
  for p, (value, annotation) in converted.items():
    t_value, t_annotation = template_params[p]
    check_against_template('params/' + format_path(p), value, annotation, t_value, t_annotation)

  mesh_hint = options.mesh or mesh_of_tree(param_flat)
  step, opt_state = nnx_opt_to_linen(optimizer, param_flat, target, options, mesh_hint)
  return target.replace(step=step, params=params, opt_state=opt_state)


def relayout(
    tree,
    *,
    scan: bool,
    paths: PathMapping = KIT_PATHS,
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
    flat = read_nnx_state(tree, 'model', only=nnx.Param)
    converted = convert_flat(flat, 'nnx', 'nnx', options)
    return nnx.State(
        nest({p: md.write_nnx(nnx.Param, v, a) for p, (v, a) in converted.items()})
    )
  if isinstance(tree, Mapping) and set(tree) == {'params'}:
    flat = read_linen_tree(tree['params'], 'params')
    converted = convert_flat(flat, 'linen', 'linen', options)
    return {'params': nest({p: md.write_linen(v, a) for p, (v, a) in converted.items()})}
  raise StructureError(
      "relayout takes Linen {'params': ...} or an nnx.State of Params, got "
      f'{type(tree).__name__}'
  )
