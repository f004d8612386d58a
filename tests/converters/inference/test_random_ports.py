"""The property: on random models and random ports of them that change
nothing the outputs see, `infer_paths` either refuses or returns a mapping
under which the port computes the original's outputs; never a wrong one.
Ports that only rename, nest, reorder, swap operands, move a scale, add,
remove or move constraints, or broadcast instead of tiling must map;
kernels stored transposed are inferred with their transform when one
combination alone is proven (most are: 34% of the nightly run's ports map
so, 1% are refused), so those ports may be refused, and so may ports that
fuse two kernels into one parameter or split one in two (not inferred:
their rules are the user's to give).

Across modes (gates on a mask the example keeps all true, dropout, gradient
reversals: layers alike at the example in eval mode), a mapping returned is
right on other masks, in training and backward; a port may be refused only
as one the structure and the witness cannot decide.

The same holds for stacks of layers: a random block scanned or looped on
either side, rematerialized or not. A port that runs its stack from the end
(Linen's layer i is its layer count-1-i) may be refused, never mapped layer
i to layer i."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from converters import infer_paths, linen_to_nnx
from converters.errors import PathMappingError
from tests.converters.inference import random_ports as rp
from tests.converters.inference.call_order_masks import masks_in_call_order
from tests.hypothesis_profiles import compiling
from tests.helpers import mesh


N = rp.N
_INPUTS = (rp.Node('input', extra='0'), rp.Node('input', extra='1'))
_KERNELS = (('w0', (N, N)), ('w1', (N, N)))


def _renamed(*names, order, **changes) -> rp.Rewrite:
  unchanged = dict(swapped=frozenset(), scaled=frozenset(), constrained=frozenset(), transposed=frozenset())
  return rp.Rewrite(
      tuple((name, ('blk', f'p{k}')) for k, name in enumerate(names)), order, **(unchanged | changes)
  )


# the defect classes that paired wrongly, silently (issue 38), as programs
SUM_EVALUATED_IN_ANOTHER_ORDER = (  # Dense_a(x1) + Dense_b(x2), the port runs b first
    rp.Program(2, _INPUTS + (
        rp.Node('dense', (0,), 'w0', ''), rp.Node('dense', (1,), 'w1', ''), rp.Node('add', (2, 3)),
    ), _KERNELS),
    _renamed('w0', 'w1', order=(0, 1, 3, 2, 4)),
)
BRANCHES_COMPUTED_IN_ANOTHER_ORDER = (  # concatenated in the same order
    rp.Program(1, _INPUTS[:1] + (
        rp.Node('dense', (0,), 'w0', ''), rp.Node('dense', (0,), 'w1', ''),
        rp.Node('concat', (1, 2), 'c2'),
    ), _KERNELS + (('c2', (2 * N, N)),)),
    _renamed('w0', 'w1', 'c2', order=(0, 2, 1, 3)),
)
SQUARE_KERNEL_STORED_TRANSPOSED = (
    rp.Program(1, _INPUTS[:1] + (rp.Node('dense', (0,), 'w0', ''),), _KERNELS[:1]),
    _renamed('w0', order=(0, 1), transposed=frozenset({'w0'}), in_call=frozenset({'w0'})),
)
KERNELS_FUSED = (  # as a port fuses a query's and a key's kernels
    rp.Program(1, _INPUTS[:1] + (
        rp.Node('dense', (0,), 'w0', ''), rp.Node('dense', (0,), 'w1', ''), rp.Node('mul', (1, 2)),
    ), _KERNELS),
    _renamed('w0', 'w1', order=(0, 1, 2, 3), fused=('w1', 'w0')),
)

# found by the nightly run: outputs in the hundreds, summed in another order,
# differ by 3e-5 in an element near 1 (the tolerance is of the outputs' scale)
LAYERS_SUMMED_IN_ANOTHER_ORDER = (
    rp.Program(1, _INPUTS[:1] + (
        rp.Node('dense', (0,), 'w0', ''), rp.Node('dense', (0,), 'w1', ''),
        rp.Node('dense', (0,), 'w2', ''), rp.Node('bias', (0,), 'b3'), rp.Node('bias', (3,), 'b4'),
        rp.Node('dense', (3,), 'w5', 'scaled'), rp.Node('add', (6, 2)), rp.Node('add', (7, 4)),
        rp.Node('add', (8, 5)), rp.Node('add', (9, 6)),
    ), _KERNELS + (('w2', (N, N)), ('b3', (N,)), ('b4', (N,)), ('w5', (N, N)))),
    _renamed('w0', 'w1', 'w2', 'b3', 'b4', 'w5', order=(0, 2, 3, 4, 1, 5, 6, 7, 8, 9, 10),
             swapped=frozenset({7, 8}), scaled=frozenset({6}), constrained=frozenset({0})),
    rp.Layers(2, linen_scan=False, nnx_scan=False, remat=False, reverse=False),
)


@st.composite
def ports(draw):
  program = draw(rp.programs())
  return program, draw(rp.rewrites(program))


# Each example compiles its own programs: CI runs one beside the pinned
# regressions (`compiling`), nightly all.
@settings(compiling, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ports())
@example(SUM_EVALUATED_IN_ANOTHER_ORDER)
@example(BRANCHES_COMPUTED_IN_ANOTHER_ORDER)
@example(SQUARE_KERNEL_STORED_TRANSPOSED)
@example(KERNELS_FUSED)
def test_inference_never_returns_a_wrong_mapping(port):
  program, rewrite = port
  inputs = rp.example_inputs(program)
  linen = rp.linen_model(program, rewrite.linen_constrained)
  with jax.set_mesh(mesh((8, 1))):
    model = rp.nnx_port(program, rewrite, nnx.Rngs(0))
    try:
      mapping = infer_paths(linen, model, *inputs)
    except PathMappingError as error:
      event('refused' + _how_stored(rewrite))
      assert rewrite.reshaped, f'refused a port that only rewrites what the outputs do not see: {error}'
      return
    event('mapped' + _how_stored(rewrite))
    _assert_computes_the_same(linen, model, mapping, program, inputs)


@st.composite
def ports_with_modes(draw):
  program = draw(rp.programs(modes=True))
  return program, draw(rp.rewrites(program, transposes=False))


# Two kernels summed, one behind dropout, the other behind a gradient
# reversal, both gated by a mask the example keeps all true: alike at the
# example in eval mode, told apart by other masks, training and gradients.
KERNELS_ALIKE_BUT_IN_TRAINING_AND_BACKWARD = (
    rp.Program(1, _INPUTS[:1] + (
        rp.Node('dense', (0,), 'w0', ''), rp.Node('dense', (0,), 'w1', ''),
        rp.Node('drop', (1,)), rp.Node('reverse', (2,)), rp.Node('add', (3, 4)),
        rp.Node('gate', (5, 1)),
    ), _KERNELS, gated=True),
    _renamed('w1', 'w0', order=(0, 1, 2, 3, 4, 5, 6), swapped=frozenset({6})),
)


# Each example compiles its own programs: CI runs one (`compiling`), nightly all.
@settings(compiling, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ports_with_modes())
@example(KERNELS_ALIKE_BUT_IN_TRAINING_AND_BACKWARD)
def test_inference_across_modes_never_returns_a_wrong_mapping(port):
  """Gates on a mask the example keeps all true, dropout and gradient
  reversals: a mapping returned is right on other masks, in training
  (dropout masks drawn alike) and backward, or the port is refused; only
  ports that draw alike in training yet differ there may be refused."""
  program, rewrite = port
  inputs = rp.example_inputs(program)
  linen = rp.linen_model(program, rewrite.linen_constrained)
  with jax.set_mesh(mesh((8, 1))):
    model = rp.nnx_port(program, rewrite, nnx.Rngs(0))
    model.eval()
    try:
      mapping = infer_paths(linen, model, *inputs)
    except PathMappingError as error:
      event('refused')
      assert 'in training' in str(error) or 'cannot tell these apart' in str(error), str(error)
      return
    event('mapped')
    _assert_computes_the_same(linen, model, mapping, program, inputs)
    _assert_the_same_in_training_and_backward(linen, model, mapping, program)


@st.composite
def layer_ports(draw):
  program = draw(rp.programs(inputs=st.just(1)))
  return program, draw(rp.rewrites(program)), draw(rp.layers())


# Nightly; CI: the layers refused run backwards (test_infer), test_wrong_pairs'
# scanned and remat cases, scan against loop (test_a_model_that_scans_maps_to_a_port_that_loops).
@pytest.mark.nightly
@settings(compiling, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(layer_ports())
@example(LAYERS_SUMMED_IN_ANOTHER_ORDER)
@example((*BRANCHES_COMPUTED_IN_ANOTHER_ORDER[:1], _renamed('w0', 'w1', 'c2', order=(0, 1, 2, 3)),
          rp.Layers(3, linen_scan=True, nnx_scan=False, remat=True, reverse=True)))
@example((*BRANCHES_COMPUTED_IN_ANOTHER_ORDER, rp.Layers(2, True, True, False, reverse=False)))
def test_inference_never_returns_a_wrong_mapping_of_layers(port):
  program, rewrite, layers = port
  event(f'linen {"scan" if layers.linen_scan else "loop"}, nnx {"scan" if layers.nnx_scan else "loop"}')
  inputs = rp.example_inputs(program)
  linen = rp.linen_layers_model(program, layers, rewrite.linen_constrained)
  with jax.set_mesh(mesh((8, 1))):
    model = rp.nnx_layers_port(program, rewrite, layers, nnx.Rngs(0))
    try:
      mapping = infer_paths(linen, model, *inputs)
    except PathMappingError as error:
      event('refused' + (' (layers run from the end)' if layers.reverse else _how_stored(rewrite)))
      assert rewrite.reshaped or layers.reverse, (
          f'refused a port that only rewrites what the outputs do not see: {error}'
      )
      return
    event('mapped' + (' (layers run from the end)' if layers.reverse else _how_stored(rewrite)))
    _assert_computes_the_same(linen, model, mapping, program, inputs)


def _how_stored(rewrite) -> str:
  return ''.join(
      f' ({what})' for what, drawn in (
          ('kernels stored transposed', rewrite.transposed), ('kernels fused', rewrite.fused),
          ('a kernel split', rewrite.split),
      ) if drawn
  )


def _unseen_mask(program):
  """A mask both ways, drawn apart from anything inference draws."""
  return jax.random.bernoulli(jax.random.key(77), 0.5, (rp.BATCH, rp.N)) if program.gated else None


def _assert_computes_the_same(linen, model, mapping, program, inputs):
  variables = jax.jit(linen.init)(jax.random.key(1), *inputs)
  ported = linen_to_nnx(variables, target=model, paths=mapping)
  unseen = rp.example_inputs(program, seed=1_000, mask=_unseen_mask(program))
  for checked in (inputs, unseen):  # and inputs inference never saw
    got = nnx.jit(lambda m, *a: m(*a))(ported, *checked)
    want = np.asarray(jax.jit(linen.apply)(variables, *checked))
    # Another order of evaluation rounds otherwise, by float32 steps of the
    # largest terms summed, not of each result; a wrong pair moves the
    # outputs by their own scale.
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _assert_the_same_in_training_and_backward(linen, model, mapping, program):
  inputs = rp.example_inputs(program, seed=2_000, mask=_unseen_mask(program))
  variables = linen.init(jax.random.key(1), *inputs)
  ported = linen_to_nnx(variables, target=model, paths=mapping)
  ported.eval()
  weights = jax.random.normal(jax.random.key(3), (rp.BATCH, rp.N))
  # Backward: the gradient of a fixed projection with respect to the float inputs.
  floats = inputs[:program.inputs]
  rest = inputs[program.inputs:]
  got = jax.grad(lambda xs: jnp.sum(ported(*xs, *rest) * weights))(floats)
  want = jax.grad(lambda xs: jnp.sum(linen.apply(variables, *xs, *rest) * weights))(floats)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5 * np.abs(w).max())
  # In training, the dropout masks drawn alike by call order.
  ported.train()
  with masks_in_call_order():
    got = np.asarray(ported(*inputs))
  with masks_in_call_order():
    want = np.asarray(linen.apply(variables, *inputs, train=True, rngs={'dropout': jax.random.key(2)}))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
