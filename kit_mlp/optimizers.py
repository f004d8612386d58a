"""The optax transforms both implementations train with, chosen by name.

Linen wraps the transform in a `TrainState`; NNX in `nnx.Optimizer(model, tx,
wrt=nnx.Param)`. The exception is `'fsdp_sgd'`: NNX keeps the hand-written SGD of
the NNX FSDP toy example (`nnx_impl.sgd.SGD`), and Linen uses the optax chain
that applies the same rule, `ema(decay, debias=False)` then `scale(-lr)`.
"""

from __future__ import annotations

import optax

OPTIMIZERS = ('adam', 'adamw', 'sgd_momentum', 'fsdp_sgd')
DEFAULT_LEARNING_RATE = 1e-3
FSDP_SGD_DECAY = 0.9


def make_tx(
    name: str, learning_rate: float = DEFAULT_LEARNING_RATE
) -> optax.GradientTransformation:
  """The optax transform called `name`, with the kit's fixed hyperparameters."""
  if name == 'adam':
    return optax.adam(learning_rate)
  if name == 'adamw':
    return optax.adamw(learning_rate, weight_decay=1e-4)
  if name == 'sgd_momentum':
    return optax.sgd(learning_rate, momentum=0.9)
  if name == 'fsdp_sgd':
    # m <- decay * m + (1 - decay) * g;  p <- p - lr * m
    return optax.chain(
        optax.ema(FSDP_SGD_DECAY, debias=False), optax.scale(-learning_rate)
    )
  raise ValueError(f'optimizer={name!r}: use one of {OPTIMIZERS}')
