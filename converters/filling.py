"""Filling a target: the converted leaves checked against the target's, in its form.

`fill` is the one loop every conversion with a target runs (an NNX model and
optimizer, Linen collections, an optax state): the converted leaves must be
exactly the target's paths, and each must share the target leaf's shape,
dtype, mesh and resolved sharding (`converters.checks`); it returns what to
write, each annotation in the target's form. Scalars of optimizer state
(steps, counts, hyperparameters) are converted to the target's dtype
(`scalar_like`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from converters import metadata as md
from converters import provenance, relayout_ops
from converters.checks import check_against_template, check_keys
from converters.errors import LeafErrors, ShapeError
from converters.options import Options
from converters.paths import format_path
from converters.sharding import place_scalar

#: `{path: (value, annotation)}`; a None annotation marks a scalar of optimizer state.
Leaves = Mapping[tuple, tuple[Any, md.Annotation | None]]


def fill(
    where: str,
    template: Leaves,
    produced: Leaves,
    *,
    options: Options,
    mesh: Mesh | None = None,
    prefix: str = '',
    explain: Callable[[tuple, bool], str | None] | None = None,
    check_kind: Callable[[tuple, str], None] | None = None,
    check_metadata: Callable[[tuple, str, md.Annotation], None] | None = None,
    in_produced_order: bool = False,
) -> dict[tuple, tuple[Any, md.Annotation | None]]:
  """What to write at each path of `template`, every leaf checked first.

  Args:
    where: how the key check names this fill (`'linen -> nnx'`).
    template: `{path: (value, annotation)}` of the target (arrays or abstract).
    produced: `{path: (value, annotation or None)}` converted for it.
    options: the conversion's; its rules resolve and are attached.
    mesh: where a scalar converted from a host value is placed.
    prefix: put before each path in messages (`'opt_state/'`).
    explain: says for one path why it is missing or unexpected (`check_keys`).
    check_kind: `(path, name)`, checked before the leaf's shape, dtype and
      annotation: that the target holds a leaf of its kind there (an NNX
      Variable of the collection's type).
    check_metadata: `(path, name, annotation)`, checked after them: that the
      target takes the leaf's extra metadata.
    in_produced_order: check and return the leaves in `produced`'s order (a
      Linen tree keeps the converted order) rather than the template's.

  Raises:
    ConversionError: naming every offending leaf; of the first failure's class.
  """
  check_keys(where, template, produced, explain=explain)
  filled = {}
  errors = LeafErrors()
  for path in produced if in_produced_order else template:
    (t_value, t_annotation), (value, annotation) = template[path], produced[path]
    name = prefix + format_path(path)
    with errors.leaf():
      if annotation is None:
        filled[path] = (scalar_like(value, t_value.dtype, mesh, name), None)
        continue
      if check_kind is not None:
        check_kind(path, name)
      check_against_template(
          name, value, annotation, t_value, t_annotation, rules=options.resolution_rules
      )
      if check_metadata is not None:
        check_metadata(path, name, annotation)
      form = md.with_default_rules(in_target_form(annotation, t_annotation), options.rules)
      filled[path] = (value, form)
  errors.raise_any()
  return filled


def in_target_form(annotation: md.Annotation, t_annotation: md.Annotation | None) -> md.Annotation:
  """The annotation to write for a leaf that `check_against_template` accepted:
  the target's form (names, rules, mesh), with the converted leaf's extra metadata."""
  if t_annotation is None or (annotation.names, annotation.rules, annotation.logical) == (
      t_annotation.names, t_annotation.rules, t_annotation.logical
  ):
    return annotation
  return dataclasses.replace(t_annotation, extra=annotation.extra)


def scalar_like(value, template_dtype, mesh: Mesh | None, where: str):
  """An optimizer scalar in the other side's form: a step or count converted to
  its integer dtype (refused if it does not fit), any other scalar (a
  hyperparameter of `optax.inject_hyperparams`) kept as it is, of the same dtype."""
  shape = tuple(value.shape) if hasattr(value, 'shape') else np.shape(value)
  if shape != ():
    raise ShapeError(
        f'{where}: expected a scalar (a step, count or hyperparameter), found shape {shape}',
        [where],
    )
  dtype = value.dtype if hasattr(value, 'dtype') else np.asarray(value).dtype
  if not np.issubdtype(np.dtype(template_dtype), np.integer):
    if np.dtype(dtype) != np.dtype(template_dtype):
      raise ShapeError(
          f'{where}: is {np.dtype(dtype)}, the target holds {np.dtype(template_dtype)}',
          [where],
          fix='build the target with the same optimizer, hyperparameters of the same dtype',
      )
    return place_scalar(value, mesh)
  if np.dtype(dtype).kind not in 'iu':
    raise ShapeError(
        f'{where}: is {value!r} of dtype {dtype}, not an integer; a step or count '
        'must be an integer so no value is rounded',
        [where],
    )
  if isinstance(value, jax.ShapeDtypeStruct):  # an abstract state gives an abstract step
    sharding = NamedSharding(mesh, PartitionSpec()) if mesh else value.sharding
    return provenance.record(
        jax.ShapeDtypeStruct((), np.dtype(template_dtype), sharding=sharding),
        provenance.Derivation(relayout_ops.Cast(np.dtype(template_dtype)), (value,)),
    )
  try:
    number = int(np.asarray(value))
  except Exception:  # an array this process cannot read whole: its dtype was checked
    number = None
  limits = np.iinfo(template_dtype)
  if number is not None and not limits.min <= number <= limits.max:
    raise ShapeError(
        f'{where}: {number} does not fit the target\'s {np.dtype(template_dtype)} '
        f'[{limits.min}, {limits.max}]',
        [where],
    )
  if isinstance(value, jax.Array):
    return value if value.dtype == template_dtype else value.astype(template_dtype)
  array = np.asarray(value, dtype=template_dtype)
  return jax.device_put(array, NamedSharding(mesh, PartitionSpec())) if mesh else jnp.asarray(array)


