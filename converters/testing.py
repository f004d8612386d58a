"""Equivalence-testing helpers for your own CI: strategies and assertions.

Strategies (hypothesis) generate what the kit's property suite explores:
`mesh_shapes()` (every (data, model) factorisation of 8 devices),
`rule_sets()` (valid logical rules, the guide's and the FSDP ones included),
`descriptions()` (whole `ModelDescription`s) and `optimizers()`.

Assertions compare a Linen model with its NNX port and, on failure, raise an
`AssertionError` whose message is a readable table: which parameter, the spec
and sharding on each side, the max abs difference and where it is.

- `assert_same_layout(linen_variables, nnx_state, paths=...)`: every
  corresponding parameter has the same shape, dtype, resolved PartitionSpec and
  an equivalent actual `NamedSharding`.
- `assert_same_values(linen_variables, nnx_state, paths=...)`: every
  corresponding parameter holds the same values.
- `assert_same_outputs(linen_module, linen_variables, nnx_model, *inputs,
  paths=...)`: the NNX model, given the Linen parameters (converted, zero
  copy), computes the same outputs with the same sharding. Your model is not
  modified.

They work for any model pair that a `PathMapping` relates, not only the kit's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from flax import nnx
from hypothesis import assume, event, strategies as st

from converters.api import linen_to_nnx
from converters.description import (
    DTYPES,
    FSDP_RULES,
    GUIDE_RULES,
    InvalidDescriptionError,
    ModelDescription,
)
from converters.optimizers import OPTIMIZERS
from converters.paths import KIT_PATHS, PathMapping, format_path
from converters.report import format_table
from converters.tree_io import nest

# -- strategies ------------------------------------------------------------------------

MESH_SHAPES = ((1, 8), (2, 4), (4, 2), (8, 1))
_AXES = (None, 'data', 'model')


def mesh_shapes() -> st.SearchStrategy[tuple[int, int]]:
  """Every `(data, model)` factorisation of 8 devices."""
  return st.sampled_from(MESH_SHAPES)


@st.composite
def random_rule_sets(draw) -> tuple:
  """Logical rules, in any order, where no parameter puts one mesh axis on two
  dimensions.

  Activations may: `('batch', 'embed')` with both sent to one axis. Linen
  gives the axis to the rule listed first, so the order is drawn too.
  """
  hidden = draw(st.sampled_from(_AXES))
  embed = draw(st.sampled_from([a for a in _AXES if a is None or a != hidden]))
  layer = draw(st.sampled_from([a for a in _AXES if a is None or a not in (hidden, embed)]))
  batch = draw(st.sampled_from(_AXES))
  rules = (('batch', batch), ('hidden', hidden), ('embed', embed), ('layer', layer))
  return tuple(draw(st.permutations(rules)))


def rule_sets() -> st.SearchStrategy[tuple]:
  """The guide's rules, the FSDP rules, or random valid ones."""
  return st.one_of(st.sampled_from([GUIDE_RULES, FSDP_RULES]), random_rule_sets())


def optimizers() -> st.SearchStrategy[str]:
  return st.sampled_from(OPTIMIZERS)


@st.composite
def descriptions(
    draw,
    mesh_shape: st.SearchStrategy | None = None,
    max_layers: int = 6,
    dtypes: Sequence[str] = DTYPES,
    annotations: Sequence[str] = ('device', 'logical'),
    layouts: Sequence[bool] = (False, True),
) -> ModelDescription:
  """Valid model descriptions; records hypothesis events for the statistics.

  `layouts` are the `use_scan` values to draw from (`(True,)`: scanned only).
  """
  shape = draw(mesh_shape if mesh_shape is not None else mesh_shapes())
  annotation = draw(st.sampled_from(annotations))
  logical = annotation == 'logical'
  rules = draw(rule_sets()) if logical else GUIDE_RULES
  use_scan = draw(st.sampled_from(layouts))
  layer_choices = (None, 'layer') if logical else (None, 'data')
  layer_partition = draw(st.sampled_from(layer_choices)) if use_scan else None
  num_layers = draw(st.integers(1, max_layers))
  depth = 8 * draw(st.integers(1, 4))  # every mesh axis size divides it
  batch = shape[0] * draw(st.integers(1, 2))
  dtype = draw(st.sampled_from(dtypes))
  try:
    desc = ModelDescription(
        num_layers=num_layers, depth=depth, batch=batch, use_scan=use_scan,
        layer_partition=layer_partition, annotation=annotation, rules=rules,
        mesh_shape=shape, dtype=dtype,
    )
  except InvalidDescriptionError:
    assume(False)  # e.g. num_layers not divisible by a layer mesh axis
  event(f'mesh {shape[0]}x{shape[1]}')
  event('scan' if use_scan else 'loop')
  event(f'annotation {annotation}' + (f' rules {_rules_name(rules)}' if logical else ''))
  event(f'layer partition {layer_partition}')
  event(f'dtype {dtype}')
  return desc


def _rules_name(rules) -> str:
  return {GUIDE_RULES: 'guide', FSDP_RULES: 'fsdp'}.get(rules, 'random')


# -- assertions ------------------------------------------------------------------------


def _flat_nnx(state) -> dict[tuple, nnx.Variable]:
  if isinstance(state, nnx.Module):
    state = nnx.state(state, nnx.Param)
  return {tuple(p): v for p, v in nnx.to_flat_state(state)}


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
    paths: PathMapping = KIT_PATHS,
    scan: bool | None = None,
) -> None:
  """Same parameters, shapes, dtypes, PartitionSpecs and actual shardings."""
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


def _max_diff(a, b) -> tuple[float, tuple[int, ...]]:
  a = np.asarray(jax.device_get(a), dtype=np.float64)
  b = np.asarray(jax.device_get(b), dtype=np.float64)
  diff = np.abs(a - b)
  if diff.size == 0:
    return 0.0, ()
  where = np.unravel_index(int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff))), diff.shape)
  return float(diff[where]), tuple(int(i) for i in where)


def _differs(a, b, atol: float) -> bool:
  if atol == 0:
    a, b = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))
    return a.tobytes() != b.tobytes()
  return _max_diff(a, b)[0] > atol


def assert_same_values(
    linen_variables: dict,
    nnx_state: nnx.State | nnx.Module,
    *,
    paths: PathMapping = KIT_PATHS,
    scan: bool | None = None,
    atol: float = 0.0,
) -> None:
  """Every corresponding parameter holds the same values (bit for bit by default)."""
  pairs, missing, extra = _pairs(linen_variables, nnx_state, paths, scan)
  rows = []
  for path in sorted(pairs, key=format_path):
    a, b = (v.get_value() for v in pairs[path])
    if a.shape != b.shape or _differs(a, b, atol):
      diff, where = _max_diff(a, b) if a.shape == b.shape else (float('inf'), ())
      rows.append([format_path(path), f'{diff:.3g}', str(where)])
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
    paths: PathMapping = KIT_PATHS,
    scan: bool | None = None,
    atol: float = 0.0,
) -> None:
  """The NNX model with the Linen parameters computes the Linen outputs.

  Both run under `jax.jit` (with the mesh in context if you set one). The
  Linen parameters are converted into a copy of `nnx_model`'s graph; the
  model itself is not modified. Outputs are compared bit for bit unless
  `atol > 0` (give your reason for a tolerance where you call it).
  """
  graphdef, state = nnx.split(nnx_model)
  converted = linen_to_nnx(linen_variables, paths=paths, scan=scan)
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
    if a.shape != b.shape or a.dtype != b.dtype or _differs(a, b, atol) or not sharding_same:
      diff, where = _max_diff(a, b) if a.shape == b.shape else (float('inf'), ())
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

