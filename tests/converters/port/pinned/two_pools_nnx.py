"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:two_pools`.

Each class is the NNX counterpart of the Linen class of the same name;
`two_pools_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths two_pools_nnx_paths:PATHS`).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

#: A module constant no configuration changes: the branch it guards is never traced.
REMAT_BLOCKS = False


class TokenPool(nnx.Module):
  """A class token only `pool='tok'` makes, its width the input's."""

  def __init__(self, pool: str = 'gap', *, in_features: int, rngs: nnx.Rngs):
    self.pool = pool
    if pool == 'tok':
      self.cls = nnx.Param(nnx.initializers.normal()(rngs.params(), (1, 1, in_features)))
    if REMAT_BLOCKS:  # never traced: its variable too
      raise NotImplementedError('TokenPool: the if branch of `if REMAT_BLOCKS` was not traced, so the port does not write it: trace a configuration that takes it, or port it by hand')
    self.dense = nnx.Linear(in_features, 3, rngs=rngs)

  def __call__(self, x):
    if self.pool == 'tok':
      cls = self.cls[...]
      x = jnp.concatenate([jnp.tile(cls, [x.shape[0], 1, 1]), x], axis=1)
    if REMAT_BLOCKS:  # never traced: its variable too
      raise NotImplementedError('TokenPool: the if branch of `if REMAT_BLOCKS` was not traced, so the port does not write it: trace a configuration that takes it, or port it by hand')
    return self.dense(x.mean(axis=1))


class TwoPools(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.token_pool_0 = TokenPool(in_features=in_features, rngs=rngs)
    self.token_pool_1 = TokenPool('tok', in_features=in_features, rngs=rngs)

  def __call__(self, x):
    return self.token_pool_0(x) + self.token_pool_1(x)
