"""`nn.remat` of a module outside a scan: blocks made in a loop through one
rematerialised class, their mode flag static (`static_argnums=(2,)`, the
module counted as argument 0), a user's module under `nn.remat` with
`prevent_cse=False`, one bound to a local and called twice, and a Flax
layer under it (`CheckpointDense_0`, Linen's name for it), and a `__call__`
decorated with `nn.remat`. Each module is called through a function under
`nnx.remat`, written once before a loop, its first input passed and the
rest closed over (constants of it, as `static_argnums` made them of
Linen's), but for those read off the loop, passed (and static where
Linen's were); the layer's attribute is named for what it is (`dense`). The
decorated `__call__` is NNX's remat of the method, its static arguments
numbered in the signature left once the mode flag is gone."""

import functools

import jax.numpy as jnp
from flax import linen as nn

from converters import LinenModel


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    return nn.Dropout(0.1)(nn.relu(nn.Dense(x.shape[-1])(x)), deterministic)


class Scaled(nn.Module):
  @functools.partial(nn.remat, static_argnums=(2, 3), prevent_cse=False)
  @nn.compact
  def __call__(self, x, deterministic=True, double=False):
    y = nn.Dropout(0.1)(nn.Dense(x.shape[-1])(x), deterministic)
    return 2 * y if double else y


class Odd(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True, double=False):
    return nn.Dropout(0.1)(nn.Dense(x.shape[-1])(x), deterministic) * (2.0 if double else 1.0)


class Encoder(nn.Module):
  depth: int = 2

  @nn.compact
  def __call__(self, x, deterministic=True):
    block = nn.remat(Block, static_argnums=(2,))
    for i in range(self.depth):
      x = block(name=f'block_{i}')(x, deterministic)
    for i in range(2):  # a static argument read off the loop: passed, static, not closed over
      x = nn.remat(Odd, static_argnums=(2, 3))(name=f'odd_{i}')(x, deterministic, i % 2 == 1)
    x = nn.remat(Block, prevent_cse=False, static_argnums=(2,))(name='last')(x, deterministic)
    x = Scaled(name='scaled')(x, deterministic, True)
    shared = nn.remat(Block, static_argnums=(2,))(name='shared')  # one module, called twice
    x = shared(shared(x, deterministic) + 1.0, deterministic)
    return nn.remat(nn.Dense)(3)(nn.LayerNorm(name='norm')(x))


def model() -> LinenModel:
  return LinenModel(Encoder(), jnp.ones((2, 5)), deterministic=True)
