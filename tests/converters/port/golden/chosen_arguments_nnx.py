"""NNX port of `tests.converters.port.golden.chosen_arguments`, written by
`linen-nnx port tests.converters.port.golden.chosen_arguments:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`chosen_arguments_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
chosen_arguments_nnx_paths:PATHS`). Proven equivalent when written: see
`test_chosen_arguments_nnx_port.py`.
"""
from __future__ import annotations

from flax import nnx


class Head(nnx.Module):

  def __init__(self, num_classes: int = 3, head_zeroinit: bool = False, use_bias: bool = True, *, in_features: int, rngs: nnx.Rngs):
    self.pre_logits = nnx.Linear(
        in_features,
        8,
        **({'use_bias': False} if not use_bias else {'use_bias': True}),
        rngs=rngs,
    )
    self.head = nnx.Linear(
        8,
        num_classes,
        **({'kernel_init': nnx.initializers.zeros} if head_zeroinit else {}),
        rngs=rngs,
    )

  def __call__(self, x):
    x = self.pre_logits(x)
    return self.head(nnx.tanh(x))
