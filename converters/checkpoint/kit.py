"""The kit's own optimizers as the checkpoint tool knows them.

The FSDP example's hand-written SGD (`nnx_impl.sgd.SGD`) keeps the trace of
`optax.chain(optax.ema(decay, debias=False), optax.scale(-lr))` as its
`momentum` and no `count` (it always equals the step). Importing this module
registers that correspondence with `converters.register_optimizer`, the way a
user registers an optimizer of their own; `correspondence_of_name` gives the
correspondence of an optimizer named on the command line.
"""

from __future__ import annotations

from converters.optimizer_state import (
    NNX_OPTIMIZER,
    OptimizerCorrespondence,
    register_optimizer,
)
from nnx_impl.sgd import SGD

FSDP_SGD = OptimizerCorrespondence(
    'SGD (NNX FSDP example)', to_nnx={(0, 'ema'): ('momentum',)}, derived_from_step=((0, 'count'),)
)
register_optimizer(SGD, FSDP_SGD)


def correspondence_of_name(optimizer: str) -> OptimizerCorrespondence:
  """The correspondence of a `kit_mlp.optimizers` name ('fsdp_sgd' is the NNX SGD)."""
  return FSDP_SGD if optimizer == 'fsdp_sgd' else NNX_OPTIMIZER
