"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:awkward`.

Each class is the NNX counterpart of the Linen class of the same name;
`awkward_nnx_paths.PATHS`, written beside this file, maps the Linen variables
onto these modules (`linen-nnx convert --paths awkward_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


class Awkward(nnx.Module):
  """A keyword as a name, a positional `use_bias`, an enumerate target, a
  loop variable read after its loop, a `dataclasses.field` default."""

  def __init__(self, widths: tuple[int, ...] = (4, 4), *, in_features: int, rngs: nnx.Rngs):
    self.widths = widths
    self.class_ = nnx.Linear(in_features, 4, use_bias=False, rngs=rngs)
    self.denses = nnx.List()
    in_size = 4
    for i, w in enumerate(widths):
      self.denses.append(nnx.Linear(in_size, w, rngs=rngs))
      in_size = w

  def __call__(self, x):
    x = self.class_(x)
    for (i, w), dense in zip(enumerate(self.widths), self.denses):
      x = dense(x) * (i + 1)
    return x / (i + 1)
