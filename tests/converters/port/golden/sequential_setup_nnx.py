"""NNX port of `tests.converters.port.golden.sequential_setup`, written by
`linen-nnx port tests.converters.port.golden.sequential_setup:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`sequential_setup_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
sequential_setup_nnx_paths:PATHS`). Proven equivalent when written: see
`test_sequential_setup_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Head(nnx.Module):

  def __init__(self, hidden: int = 16, classes: int = 4, *, in_features: int, rngs: nnx.Rngs):
    self.body = nnx.Sequential(
        nnx.Linear(in_features, hidden, rngs=rngs),
        nnx.tanh,
        nnx.Linear(hidden, classes, rngs=rngs),
    )

  def __call__(self, x):
    return self.body(x)
