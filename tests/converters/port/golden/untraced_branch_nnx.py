"""NNX port of `tests.converters.port.golden.untraced_branch`, written by
`linen-nnx port tests.converters.port.golden.untraced_branch:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`untraced_branch_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
untraced_branch_nnx_paths:PATHS`). Proven equivalent when written: see
`test_untraced_branch_nnx_port.py`.
"""
from __future__ import annotations

from typing import Any

from flax import nnx


class Hybrid(nnx.Module):

  def __init__(self, width: int = 8, resnet: Any = None, *, in_features: int, rngs: nnx.Rngs):
    self.resnet = resnet
    if resnet is not None:
      raise NotImplementedError('Hybrid: the if branch of `if self.resnet is not None` was not traced, so the port does not write it: trace a configuration that takes it, or port it by hand')
    self.conv = nnx.Conv(in_features, width, (2, 2), strides=(2, 2), rngs=rngs)
    self.dense = nnx.Linear(width, 3, rngs=rngs)

  def __call__(self, x):
    if self.resnet is not None:
      raise NotImplementedError('Hybrid: the if branch of `if self.resnet is not None` was not traced, so the port does not write it: trace a configuration that takes it, or port it by hand')
    else:
      x = x * 2
    x = self.conv(x)
    return self.dense(x.mean(axis=(1, 2)))
