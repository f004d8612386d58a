"""big_vision's scanned encoder: the block rematerialised into a local
(`block = nn.remat(Block, prevent_cse=False, static_argnums=(2,), policy=...)`,
its policy chosen by a field) and the local scanned (`nn.scan(block,
variable_axes={'params': 0}, ...)`): a stack made by `nnx.vmap` and run by
`nnx.scan` over `nnx.remat`, the remat's policy read from the field."""

import jax
import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    y = nn.Dropout(0.1)(nn.gelu(nn.Dense(x.shape[-1])(nn.LayerNorm()(x))), deterministic)
    return x + y, None


class Encoder(nn.Module):
  depth: int = 2
  remat_policy: str = 'nothing_saveable'

  @nn.compact
  def __call__(self, x, deterministic=True):
    block = nn.remat(
        Block,
        prevent_cse=False,
        static_argnums=(2,),  # 0=self, 2=deterministic
        policy=getattr(jax.checkpoint_policies, self.remat_policy, None),
    )
    x, _ = nn.scan(
        block,
        variable_axes={'params': 0},
        split_rngs={'params': True, 'dropout': True},
        in_axes=nn.broadcast,
        length=self.depth)(name='encoderblock')(x, deterministic)
    return nn.LayerNorm(name='encoder_norm')(x)


def model() -> LinenModel:
  return LinenModel(Encoder(), jnp.ones((2, 3, 8)), deterministic=True)
