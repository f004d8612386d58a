"""linen-nnx-kit core: conversions between Flax Linen and Flax NNX.

    from converters import linen_to_nnx, nnx_to_linen, PathRule, KIT_PATHS

`api` holds the conversions, `paths` the path mapping and its presets,
`metadata` the neutral sharding annotation, `layout` path translation and
scan <-> loop relayout, `errors` the `ConversionError` family,
`constrained_params` the NNX parameters that are constrained at use as Linen's
are (what makes a port compile to its original's program). The model
description that `linen_impl` and `nnx_impl` both build from lives in
`description`, their shared optimizers and data in `optimizers` and `data`, and
the `linen-nnx` command line in `cli`.

Names are imported lazily, so that `converters.devices` can set the simulated
device count before anything imports JAX.
"""

import importlib

_EXPORTS = {
    'linen_to_nnx': 'converters.api',
    'nnx_to_linen': 'converters.api',
    'relayout': 'converters.api',
    'ConstrainedParam': 'converters.constrained_params',
    'constrain_params_at_use': 'converters.constrained_params',
    'PathRule': 'converters.paths',
    'PathMapping': 'converters.paths',
    'KIT_PATHS': 'converters.paths',
    'GUIDE_PATHS': 'converters.paths',
    'GUIDE_LOGICAL_PATHS': 'converters.paths',
    'ConversionError': 'converters.errors',
    'PathMappingError': 'converters.errors',
    'StructureError': 'converters.errors',
    'ShapeError': 'converters.errors',
    'AnnotationError': 'converters.errors',
    'LayoutError': 'converters.errors',
    'OptimizerStateError': 'converters.errors',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
