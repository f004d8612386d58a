"""NNX port of `tests.converters.port.golden.shadowed_names`, written by
`linen-nnx port tests.converters.port.golden.shadowed_names:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`shadowed_names_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
shadowed_names_nnx_paths:PATHS`). Proven equivalent when written: see
`test_shadowed_names_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


def gate(x):
  """Read by `Net`: copied beside it."""
  return x * nnx.sigmoid(x)


class Net(nnx.Module):

  def __init__(self, features: int = 8, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(in_features, features, rngs=rngs)
    self.dense_1 = nnx.Linear(features, 2, rngs=rngs)

  def __call__(self, x):
    hidden = gate(self.dense_0(x))
    hidden = sum(hidden * model for model in (1.0, 2.0))
    return self.dense_1(hidden)
