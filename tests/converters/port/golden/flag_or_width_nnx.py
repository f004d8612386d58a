"""NNX port of `tests.converters.port.golden.flag_or_width`, written by `linen-nnx
port tests.converters.port.golden.flag_or_width:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`flag_or_width_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
flag_or_width_nnx_paths:PATHS`). Proven equivalent when written: see
`test_flag_or_width_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Head(nnx.Module):

  def __init__(self, width: int = 8, rep_size: int | bool = False, num_classes: int = 3, *, in_features: int, rngs: nnx.Rngs):
    self.rep_size = rep_size
    self.num_classes = num_classes
    self.dense = nnx.Linear(in_features, width, rngs=rngs)
    if self.rep_size:
      rep_size = width if self.rep_size is True else self.rep_size
      self.pre_logits = nnx.Linear(width, rep_size, rngs=rngs)
    if num_classes:
      self.head = nnx.Linear(
          self.pre_logits.out_features if rep_size else width,
          num_classes,
          rngs=rngs,
      )

  def __call__(self, x):
    x = self.dense(x)
    if self.rep_size:
      x = nnx.tanh(self.pre_logits(x))
    if self.num_classes:
      x = self.head(x)
    return x
