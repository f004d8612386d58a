"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:normed_rms`.

Each class is the NNX counterpart of the Linen class of the same name;
`normed_rms_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
normed_rms_nnx_paths:PATHS`).
"""
from __future__ import annotations

from flax import nnx


def _norm(kind: str, *, num_features: int, rngs: nnx.Rngs) -> nnx.Module:
  """The norm `kind` names: a helper beside the classes, as real code has."""
  if kind == 'rms':
    return nnx.RMSNorm(num_features, rngs=rngs)
  return nnx.LayerNorm(num_features, epsilon=1e-5, rngs=rngs)


def _projection(features: int, *, in_features: int, rngs: nnx.Rngs) -> nnx.Module:
  return nnx.Linear(in_features, features, use_bias=False, rngs=rngs)


class NormedBlock(nnx.Module):
  """Layers made by the file's functions, named by an argument or not."""

  def __init__(self, kind: str = 'layer', features: int = 5, *, in_features: int, rngs: nnx.Rngs):
    self.pre_norm = _norm(kind, num_features=in_features, rngs=rngs)
    self.dense_0 = _projection(features, in_features=in_features, rngs=rngs)
    self.dense_1 = _projection(features + 1, in_features=features, rngs=rngs)
    self.post_norm = _norm(kind, num_features=features + 1, rngs=rngs)

  def __call__(self, x):
    x = self.pre_norm(x)
    x = self.dense_0(x)
    x = self.dense_1(x)
    return self.post_norm(x)
