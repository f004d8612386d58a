"""`shapes.symbolic_trace`: the sizes Linen infers, as expressions of the
configuration and the inputs."""

from __future__ import annotations

import pytest

from converters.port import shapes, tracing
from tests.converters.port import linen_models


def _name(origin) -> str:
  if isinstance(origin, shapes.FieldValue):
    text = origin.access[0]
    for a in origin.access[1:]:
      text += f'[{a}]' if isinstance(a, int) else f'.{a}'
    return text
  return f'{origin.name}.shape[{origin.dim}]'


def _traced(model):
  root, _ = tracing.trace(model.module, *model.args, **model.kwargs)
  return shapes.symbolic_trace(root, ['x', 'train'])


def test_input_sizes_are_expressions_of_fields_and_inputs():
  traced = _traced(linen_models.stack(widths=(8, 12), features=5))
  inputs = {c.name: c.calls[0].args[0].shape[-1] for c in traced.root.children}
  source = {name: traced.table.source(v, _name) for name, v in inputs.items()}
  assert source == {
      'Dense_0': 'x.shape[1]',
      'Dense_1': 'config.widths[0]',
      'norm': 'config.widths[1]',
      'Dropout_0': 'config.widths[1]',
      'head': 'config.widths[1]',
  }


def test_a_field_the_code_needs_concrete_stays_a_number():
  model = linen_models.tower(depth=2)
  root, _ = tracing.trace(model.module, *model.args, **model.kwargs)
  traced = shapes.symbolic_trace(root, ['tokens'])
  symbolic = {o.access for o in traced.table.origins.values() if isinstance(o, shapes.FieldValue)}
  # `range(self.depth)` needs an int: depth stays 2 in the trace (its symbol
  # only writes sizes that change with it); the sizes are symbols.
  assert traced.root.module.depth == 2
  assert {('vocab',), ('width',), ('hidden',)} <= symbolic
  assert len([c for c in traced.root.children if c.cls is linen_models.Residual]) == 2


def test_a_size_that_changes_with_a_count_is_written_with_it():
  model = linen_models.setup_stack(num_heads=3, head_dim=4)
  root, _ = tracing.trace(model.module, *model.args, **model.kwargs)
  traced = shapes.symbolic_trace(root, ['x'])
  (norm,) = [c for c in traced.root.children if c.name == 'norm']
  assert traced.table.source(norm.calls[0].args[0].shape[-1], _name) == 'head_dim * num_heads'


# CI: tests/converters/port/test_generate.py::test_attention_and_annotations_are_written_as_names
# writes this encoder and checks the block's input sizes as written (the
# norm's and the attention's `c.width`, the second Dense's `c.hidden`), no
# input size asked for.
@pytest.mark.nightly
def test_an_input_size_the_code_ties_to_a_field_is_that_field():
  # The block's input is added to an output of `config.width` features, and
  # the width must stay a multiple of the heads: traced at widths 8, 10, 12
  # (steps of two), the input follows it, and every size is the width.
  model = linen_models.encoder(width=8, heads=2)
  root, _ = tracing.trace(model.module, *model.args, **model.kwargs)
  block = root.children[1]
  traced = shapes.symbolic_trace(block, ['x', 'mask'])
  sizes = {c.name: traced.table.source(c.calls[0].args[0].shape[-1], _name) for c in traced.root.children}
  assert sizes['LayerNorm_0'] == sizes['MultiHeadDotProductAttention_0'] == 'config.width'
  assert sizes['Dense_1'] == 'config.hidden'


def test_none_flags_strings_and_enums_are_beyond_sizes_numbers_are_not():
  # Two instances told apart here are traced symbolically each on its own:
  # `mlp_dim or 4 * d` takes the other side where `mlp_dim` is None; a
  # `rep_size: int | bool` holding a width is a symbol where a flag is not.
  none, flag = shapes.beyond_sizes(None), shapes.beyond_sizes(True)
  assert none is not None and none != shapes.beyond_sizes(3) and shapes.beyond_sizes(3) is None
  assert shapes.beyond_sizes('gap') == 'gap' and shapes.beyond_sizes('gap') != shapes.beyond_sizes('map')
  # Flags alike, whichever way they are set, and None alike with any other
  # value no symbol stands for (an initializer): each would double the traces.
  assert flag is not None and flag == shapes.beyond_sizes(False) and flag != none
  assert none == shapes.beyond_sizes(print) == shapes.beyond_sizes(0.5)
  assert shapes.beyond_sizes((None, 2)) != shapes.beyond_sizes((1, 2))
