"""Equivalence-testing helpers for your own CI: does an NNX port agree with its Linen original?

- `assert_same_layout(linen_variables, nnx_state, paths=...)`: every
  corresponding parameter has the same shape, dtype, resolved PartitionSpec and
  an equivalent actual `NamedSharding`.
- `assert_same_values(linen_variables, nnx_state, paths=...)`: every
  corresponding parameter holds the same values.
- `assert_same_outputs(linen_module, linen_variables, nnx_model, *inputs,
  paths=...)`: the NNX model, given the Linen parameters (converted, zero
  copy), computes the same outputs with the same sharding. Your model is not
  modified.
- `assert_port_equivalent(linen_module, linen_variables, nnx_model, *inputs)`:
  the whole port in one call: every collection converts both ways to exactly
  what it was, and eval-mode outputs and gradients agree (`port`).
- `assert_training_equivalent(linen_state, linen_step, (model, optimizer),
  nnx_step, batches, k=...)`: k Linen steps, conversion, the rest in NNX equal
  every step in Linen (`port`).

On failure each raises an `AssertionError` whose message is a table (laid out
by `tables`). They work for any model pair that a `PathMapping` relates.

May import: the conversion core (`converters`) and rich.
"""

from converters.testing.assertions import (
    assert_same_layout,
    assert_same_outputs,
    assert_same_values,
)
from converters.testing.port import assert_port_equivalent, assert_training_equivalent

__all__ = [
    'assert_port_equivalent', 'assert_same_layout', 'assert_same_outputs', 'assert_same_values',
    'assert_training_equivalent',
]
