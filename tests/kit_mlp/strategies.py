"""Hypothesis strategies over the kit's MLP: meshes, rule sets, descriptions, optimizers.

What the kit's property suite explores: `mesh_shapes()` (every (data, model)
factorisation of 8 devices), `rule_sets()` (valid logical rules, the guide's
and the FSDP ones included, in any order), `descriptions()` (whole
`ModelDescription`s) and `optimizers()`: the tests', as hypothesis is the
`test` extra's (the kit installs no test dependency).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import assume, event, strategies as st

from kit_mlp.description import (
    DTYPES,
    FSDP_RULES,
    GUIDE_RULES,
    InvalidDescriptionError,
    ModelDescription,
)
from kit_mlp.optimizers import OPTIMIZERS

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
