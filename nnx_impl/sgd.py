"""The hand-written SGD with momentum of the NNX FSDP toy example.

Its momentum buffers are `SGDState` Variables created with the parameters'
metadata, so they inherit each parameter's `out_sharding` (and `sharding_rules`)
and are sharded like it. The update rule is

    m <- decay * m + (1 - decay) * g;   p <- p - lr * m

which on the Linen side is `optax.chain(optax.ema(decay, debias=False),
optax.scale(-lr))` (`kit_mlp.optimizers.make_tx('fsdp_sgd')`). It exposes the
same `step` counter and `update(model, grads)` call as `nnx.Optimizer`, so the
train step does not care which one it drives.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class SGDState(nnx.Variable):
  """A momentum buffer; carries the metadata of the parameter it follows."""


# [side-by-side: optimizer-state]
class SGD(nnx.Pytree):
  """SGD with exponential-moving-average momentum over the model's `nnx.Param`s."""

  def __init__(self, model: nnx.Module, lr: float, decay: float = 0.9):
    def init_momentum(param: nnx.Variable) -> SGDState:
      return SGDState(jnp.zeros_like(param[...]), **param.get_metadata())

    self.lr = lr
    self.decay = decay
    self.step = nnx.OptState(jnp.array(0, dtype=jnp.uint32))
    self.momentum = nnx.data(
        jax.tree.map(
            init_momentum,
            nnx.state(model, nnx.Param),
            is_leaf=lambda x: isinstance(x, nnx.Variable),
        )
    )

  def update(self, model: nnx.Module, grads: nnx.State) -> None:
    """Applies one step to `model`'s parameters in place."""
    params = nnx.state(model, nnx.Param)

    # The terms are ordered as optax orders them (`ema` then `scale(-lr)` then
    # `apply_updates`), so that XLA fuses the same multiply-adds and the two
    # frameworks stay bit-identical.
    def update_param(param: nnx.Variable, momentum: SGDState, grad: nnx.Variable):
      momentum[...] = (1 - self.decay) * grad[...] + self.decay * momentum[...]
      param[...] = param[...] + (-self.lr) * momentum[...]

    jax.tree.map(
        update_param,
        params,
        self.momentum,
        grads,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    self.step[...] = self.step[...] + 1
# [/side-by-side]
