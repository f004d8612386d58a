"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:patchify`.

Each class is the NNX counterpart of the Linen class of the same name;
`patchify_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths patchify_nnx_paths:PATHS`).
"""
from __future__ import annotations

import types

from flax import nnx


class Patchify(nnx.Module):
  """A stem whose patch size lives in a namespace, as vit_jax's
  `patches.size`: the Dense after it takes the count of patches."""

  def __init__(self, patches: types.SimpleNamespace, hidden: int = 8, *, x_shape: tuple[int, ...], rngs: nnx.Rngs):
    self.hidden = hidden
    self.conv = nnx.Conv(
        x_shape[-1],
        hidden,
        patches.size,
        strides=patches.size,
        padding='VALID',
        rngs=rngs,
    )
    self.dense = nnx.Linear(
        x_shape[0] // patches.size[0] * (x_shape[1] // patches.size[-1]) * hidden,
        3,
        rngs=rngs,
    )

  def __call__(self, x):
    x = self.conv(x)
    return self.dense(x.reshape((x.shape[0], -1)))
