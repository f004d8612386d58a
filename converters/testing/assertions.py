"""Assertions that a Linen model and its NNX port agree: layouts, values, outputs.

On failure each raises an `AssertionError` whose message is a readable table:
which parameter, the spec and sharding on each side, the max abs difference
and where it is. They work for any model pair that a `PathMapping` relates.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import linen as nn
from flax import nnx

from converters.api import linen_to_nnx
from converters.comparison import differs, largest_difference
from converters.errors import PathMappingError
from converters.linen_model import LinenModel
from converters.paths import Infer, PathMapping, as_infer, format_path
from converters.testing.tables import format_table
from converters.flat_trees import nest


def _flat_nnx(state) -> dict[tuple, nnx.Variable]:
  if isinstance(state, nnx.Module):
    state = nnx.state(state, nnx.Param)
  return {tuple(p): v for p, v in nnx.to_flat_state(state)}


def _no_models_to_infer_from(check: str, paths) -> None:
  if as_infer(paths) is not None:
    raise PathMappingError(
        f"{check} compares parameter trees and has no models to infer a mapping from "
        f"(paths={paths!r}): pass paths=converters.infer_paths(linen_module, nnx_model, "
        "*example_inputs), or check the whole port with "
        "assert_port_equivalent(linen_module, variables, nnx_model, *inputs, paths='infer')"
    )


def _pairs(linen_variables, nnx_state, paths, scan):
  """`{nnx path: (linen-side Variable, nnx-side Variable)}` plus path diffs."""
  converted = _flat_nnx(linen_to_nnx(linen_variables, paths=paths, scan=scan))
  ported = _flat_nnx(nnx_state)
  missing = sorted(format_path(p) for p in set(converted) - set(ported))
  extra = sorted(format_path(p) for p in set(ported) - set(converted))
  pairs = {p: (converted[p], ported[p]) for p in converted if p in ported}
  return pairs, missing, extra


def _spec(var: nnx.Variable):
  return nnx.get_partition_spec(nnx.State({'v': var}))['v'].get_value()


def assert_same_layout(
    linen_variables: dict,
    nnx_state: nnx.State | nnx.Module,
    *,
    paths: PathMapping | None = None,
    scan: bool | None = None,
) -> None:
  """Same parameters, shapes, dtypes, PartitionSpecs and actual shardings.

  `paths` is a `PathMapping` (or None: every path kept); a mapping to infer
  needs the models: pass `converters.infer_paths(linen_module, nnx_model,
  *example_inputs)`.
  """
  _no_models_to_infer_from('assert_same_layout', paths)
  pairs, missing, extra = _pairs(linen_variables, nnx_state, paths, scan)
  rows = []
  for path in sorted(pairs, key=format_path):
    a, b = pairs[path]
    spec_a, spec_b = _spec(a), _spec(b)
    value_a, value_b = a.get_value(), b.get_value()
    problems = []
    if value_a.shape != value_b.shape:
      problems.append('shape')
    if value_a.dtype != value_b.dtype:
      problems.append('dtype')
    if tuple(spec_a) != tuple(spec_b):
      problems.append('spec')
    sharding_a = getattr(value_a, 'sharding', None)
    sharding_b = getattr(value_b, 'sharding', None)
    if (
        sharding_a is not None and sharding_b is not None and value_a.shape == value_b.shape
        and not sharding_a.is_equivalent_to(sharding_b, value_a.ndim)
    ):
      problems.append('sharding')
    if problems:
      rows.append([
          format_path(path), ','.join(problems),
          f'{value_a.shape} {value_a.dtype} {spec_a}',
          f'{value_b.shape} {value_b.dtype} {spec_b}',
      ])
  if missing or extra or rows:
    lines = ['Linen and NNX layouts differ.']
    if missing:
      lines.append(f'missing on the NNX side: {", ".join(missing)}')
    if extra:
      lines.append(f'only on the NNX side: {", ".join(extra)}')
    if rows:
      lines.append(format_table(['parameter (NNX path)', 'differs in', 'Linen', 'NNX'], rows))
    raise AssertionError('\n'.join(lines))


def assert_same_values(
    linen_variables: dict,
    nnx_state: nnx.State | nnx.Module,
    *,
    paths: PathMapping | None = None,
    scan: bool | None = None,
    atol: float = 0.0,
) -> None:
  """Every corresponding parameter holds the same values (bit for bit by default).

  `paths` as in `assert_same_layout`.
  """
  _no_models_to_infer_from('assert_same_values', paths)
  pairs, missing, extra = _pairs(linen_variables, nnx_state, paths, scan)
  rows = []
  for path in sorted(pairs, key=format_path):
    a, b = (v.get_value() for v in pairs[path])
    if a.shape != b.shape or differs(a, b, atol):
      diff, where = largest_difference(a, b) if a.shape == b.shape else (float('inf'), ())
      what = f'{diff:.3g}' if a.dtype == b.dtype else f'{diff:.3g} ({a.dtype} vs {b.dtype})'
      rows.append([format_path(path), what, str(where)])
  if missing or extra or rows:
    lines = [f'Linen and NNX parameters differ (atol={atol}).']
    if missing or extra:
      lines.append(f'missing on the NNX side: {missing}; only on the NNX side: {extra}')
    if rows:
      lines.append(format_table(['parameter (NNX path)', 'max abs diff', 'at index'], rows))
    raise AssertionError('\n'.join(lines))


def assert_same_outputs(
    linen_module: nn.Module,
    linen_variables: dict,
    nnx_model: nnx.Module,
    *inputs: Any,
    paths: PathMapping | Infer | str | None = None,
    scan: bool | None = None,
    atol: float = 0.0,
) -> None:
  """The NNX model with the Linen parameters computes the Linen outputs.

  Both run under `jax.jit` (with the mesh in context if you set one). The
  Linen parameters are converted into a copy of `nnx_model`'s graph; the
  model itself is not modified. Outputs are compared bit for bit unless
  `atol > 0` (give your reason for a tolerance where you call it). With
  `paths='infer'` (or `Infer(rules)`) the mapping is inferred from the two
  models on `inputs`.
  """
  graphdef, state = nnx.split(nnx_model)
  models = (
      {'linen_model': LinenModel(linen_module, *inputs), 'nnx_model': nnx_model}
      if as_infer(paths) is not None else {}
  )
  converted = linen_to_nnx(linen_variables, paths=paths, scan=scan, **models)
  ported = {tuple(p): v for p, v in nnx.to_flat_state(state)}
  for path, var in nnx.to_flat_state(converted):
    if tuple(path) not in ported:
      raise AssertionError(f'{format_path(path)}: converted from Linen, absent from the NNX model')
    ported[tuple(path)] = ported[tuple(path)].replace(var.get_value())
  model = nnx.merge(graphdef, nnx.State(nest(ported)))
  linen_out = jax.jit(linen_module.apply)(linen_variables, *inputs)
  nnx_out = nnx.jit(lambda m, *xs: m(*xs))(model, *inputs)
  a_leaves, a_tree = jax.tree.flatten(linen_out)
  b_leaves, b_tree = jax.tree.flatten(nnx_out)
  if a_tree != b_tree:
    raise AssertionError(f'output structures differ: Linen {a_tree}, NNX {b_tree}')
  rows = []
  for i, (a, b) in enumerate(zip(a_leaves, b_leaves)):
    sharding_same = a.sharding.is_equivalent_to(b.sharding, a.ndim)
    if a.shape != b.shape or a.dtype != b.dtype or differs(a, b, atol) or not sharding_same:
      diff, where = largest_difference(a, b) if a.shape == b.shape else (float('inf'), ())
      rows.append([
          f'output {i}', f'{a.shape} {a.dtype} {getattr(a.sharding, "spec", a.sharding)}',
          f'{b.shape} {b.dtype} {getattr(b.sharding, "spec", b.sharding)}',
          f'{diff:.3g}', str(where),
      ])
  if rows:
    raise AssertionError(
        f'Linen and NNX outputs differ (atol={atol}).\n'
        + format_table(['leaf', 'Linen', 'NNX', 'max abs diff', 'at index'], rows)
    )

