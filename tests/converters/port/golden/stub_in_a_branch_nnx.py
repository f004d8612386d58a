"""NNX port of `tests.converters.port.golden.stub_in_a_branch`, written by
`linen-nnx port tests.converters.port.golden.stub_in_a_branch:model`.

Each class is the NNX counterpart of the Linen class of the same name;
`stub_in_a_branch_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
stub_in_a_branch_nnx_paths:PATHS`). Proven equivalent when written: see
`test_stub_in_a_branch_nnx_port.py`.

A new model is in training mode, as every NNX module is: call `model.eval()`
where Linen ran with `train=False`, `model.train()` to train.
"""
from __future__ import annotations

from flax import nnx


class Encoder(nnx.Module):

  def __init__(self, depth: int = 2, width: int = 8, rate: float = 0.1, *, rngs: nnx.Rngs):
    self.depth = depth
    self.denses = nnx.List()
    self.layer_norms = nnx.List()
    self.dropouts = nnx.List()
    in_size = width
    for _ in range(depth):
      self.denses.append(nnx.Linear(in_size, width, rngs=rngs))
      in_size = width
      self.layer_norms.append(nnx.LayerNorm(in_size, rngs=rngs))
      self.dropouts.append(nnx.Dropout(rate, rngs=rngs))

  def __call__(self, x):
    denses_iter = iter(self.denses)
    layer_norms_iter = iter(self.layer_norms)
    dropouts_iter = iter(self.dropouts)
    for _ in range(self.depth):
      x = x + next(denses_iter)(next(layer_norms_iter)(x))
      x = next(dropouts_iter)(x)
    return x


# STUB: not ported (stub_in_a_branch.py:35). The Linen class, to port by hand:
# | class PoolingHead(nn.Module):
# |   """Pools the tokens with a learned probe."""
# |
# |   width: int
# |
# |   @nn.compact
# |   def __call__(self, x):
# |     probe = self.param('probe', nn.initializers.normal(), (1, 1, self.width))
# |     weigh = nn.vmap(lambda module, y: y, variable_axes={}, split_rngs={'params': False})
# |     return nn.Dense(self.width)((x * probe).mean(axis=1))
class PoolingHead(nnx.Module):
  """STUB, not ported: nn.vmap is used beyond creating a layer, and NNX has no
  nnx.vmap that is the same. Port the Linen class quoted above by hand,
  keeping this constructor (the classes around it build it so: its fields,
  in_features (the last axis of its first input), rngs) and its call (they
  call it as Linen did). Its variables are not in PATHS until then: `linen-nnx
  map` maps them once it is ported.
  """

  def __init__(self, width: int, *, in_features: int, rngs: nnx.Rngs):
    # What it made when traced (the sizes of that configuration), to start from:
    #   Dense_0 -> nnx.Linear: bias (8,), kernel (8, 8)
    #   its own variables: probe (1, 1, 8)
    raise NotImplementedError('PoolingHead is a stub: nn.vmap is used beyond creating a layer, and NNX has no nnx.vmap that is the same; port it by hand')

  def __call__(self, x):
    raise NotImplementedError('PoolingHead is a stub: nn.vmap is used beyond creating a layer, and NNX has no nnx.vmap that is the same; port it by hand')


class Classifier(nnx.Module):

  def __init__(self, width: int = 8, classes: int = 3, *, in_features: int, rngs: nnx.Rngs):
    self.dense_0 = nnx.Linear(in_features, width, rngs=rngs)
    self.encoder = Encoder(2, width, rngs=rngs)
    self.dense_1 = nnx.Linear(width, classes, rngs=rngs)
    self.pooling_head = PoolingHead(width, in_features=width, rngs=rngs)

  def __call__(self, x):
    x = self.dense_0(x)
    x = self.encoder(x)
    return self.dense_1(self.pooling_head(x))
