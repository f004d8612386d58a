"""Where each parameter of the kit's MLP lives in Linen and in NNX.

A small explicit correspondence for the kit's own model, used by the demo's
side-by-side table and by the tests that compare the two creations. Paths are
tuples of keys: Linen paths start at the `TrainState`'s `params`, NNX paths at
the `{'model': ..., 'optimizer': ...}` state.
"""

from __future__ import annotations

from converters.description import ModelDescription

# (Linen module and name, NNX attribute path) of each DotReluDot parameter.
_LAYER_PARAMS = ((('Dense_0', 'kernel'), ('dot1', 'kernel')), (('W2',), ('w2',)))


def parameter_pairs(desc: ModelDescription) -> list[tuple[tuple, tuple]]:
  """`(linen_path, nnx_path)` for every parameter of the MLP `desc` describes."""
  pairs = []
  if desc.use_scan:
    for linen_name, nnx_name in _LAYER_PARAMS:
      pairs.append(
          (('params', 'ScanDotReluDot_0') + linen_name, ('model', 'layers') + nnx_name)
      )
    return pairs
  for i in range(desc.num_layers):
    for linen_name, nnx_name in _LAYER_PARAMS:
      pairs.append(
          (('params', f'DotReluDot_{i}') + linen_name, ('model', 'layers', i) + nnx_name)
      )
  return pairs


def format_path(path: tuple) -> str:
  return '/'.join(str(k) for k in path)
