"""Path mappings of published models, ready to pass as `paths=`.

`GUIDE_PATHS`: the MLP of `DotReluDot` layers of the official Flax "scale up
on multiple devices" guides (Linen `DotReluDot_{i}/Dense_0/kernel`,
`DotReluDot_{i}/W2`, scanned `ScanDotReluDot_0/...`) <-> its NNX port
(`layers/{i}/dot1/kernel`, `layers/{i}/w2`, stacked `layers/...`). The kit's own
`linen_impl` / `nnx_impl` keep that naming (`KIT_PATHS`).
`GUIDE_LOGICAL_PATHS`: the guides' `LogicalMLP` of `LogicalDotReluDot` layers.

Each is a `PathMapping`; extend one with `GUIDE_PATHS + [PathRule(...)]`.

This is a catalogue above the conversion core, which knows no model: the core
imports nothing from here, and an omitted `paths=` keeps every path.
"""

from __future__ import annotations

from converters.paths import PathMapping, PathRule

__all__ = ['GUIDE_LOGICAL_PATHS', 'GUIDE_PATHS', 'KIT_PATHS']

_GUIDE_LAYER = (('Dense_0/kernel', 'dot1/kernel'), ('W2', 'w2'))


def _layer_rules(linen_module: str) -> list[PathRule]:
  return [
      PathRule(
          linen=f'{linen_module}_{{i}}/{linen_name}',
          nnx=f'layers/{{i}}/{nnx_name}',
          linen_stacked=f'Scan{linen_module}_0/{linen_name}',
          nnx_stacked=f'layers/{nnx_name}',
      )
      for linen_name, nnx_name in _GUIDE_LAYER
  ]


#: The Flax guides' `MLP` of `DotReluDot` layers <-> NNX `layers/i/{dot1,w2}`.
GUIDE_PATHS = PathMapping(_layer_rules('DotReluDot'))
#: The guides' `LogicalMLP` of `LogicalDotReluDot` layers.
GUIDE_LOGICAL_PATHS = PathMapping(_layer_rules('LogicalDotReluDot'))
#: The kit's own `linen_impl` / `nnx_impl` MLP, which keeps the guides' naming.
KIT_PATHS = GUIDE_PATHS
