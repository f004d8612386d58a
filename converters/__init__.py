"""linen-nnx-kit's conversion library: Flax Linen <-> Flax NNX, for any model.

    from converters import linen_to_nnx, nnx_to_linen, PathRule, PathMapping, Rearrange
    from converters import convert_checkpoint, UserModels, LinenModel   # checkpoints on disk

The public API is this module's names. The core, which knows no model, is
one pipeline: `api` (the conversions, short facades over it), `resolution`
(the path mapping decided once), `linen_trees` and `nnx_trees` (each
framework's trees read and written), `conversion` (every tree planned and
checked, then built), `planning` (the pure plan of each target leaf),
`checks` (every refusal, before any array is built), `sharding` (where
each array lives: meshes, inputs placed, targets' shardings), `execution` (jit,
donation, provenance) and `filling` (a target filled, one loop for every
kind). Beside it: `optimizer_state` (optax state <-> NNX optimizers, with a
registry for optimizers of your own), `options`, `paths` (the path mapping),
`inference` (the mapping inferred from what two models compute),
`linen_model` (a Linen module with its example inputs), `transforms` (value
transforms of path rules: reshape, transpose, fuse/split), `metadata` (the
neutral sharding annotation), `variable_types` (Linen collections <-> NNX
Variable types), `flat_trees`, `distributed` (agreement between processes),
`abstract_models` (users' NNX models created abstractly, guarded against a
Flax defect), `allocator`, `provenance`, `comparison` (arrays compared bit for
bit or within a tolerance, for every check), `compat` (the workarounds of
upstream defects, each until upstream mends it) and `errors`. Above it:
`converters.presets` (the path mappings of published models),
`converters.checkpoint` (inspect, restore, convert, verify and compare
checkpoints on disk) and `converters.testing` (equivalence assertions for
your CI).

May import: `nnx_port` (helpers an NNX port uses, re-exported here). The core
imports neither `linen_impl`, `nnx_impl`, `kit_mlp`, `model_zoo` nor `linen_nnx_cli`
(contracts in pyproject.toml, checked by `make test`).

Names are imported lazily, so that `linen_nnx_cli.devices` can set the
simulated device count before anything imports JAX.
"""

import importlib

_EXPORTS = {
    'linen_to_nnx': 'converters.api',
    'nnx_to_linen': 'converters.api',
    'relayout': 'converters.api',
    'ConstrainedParam': 'nnx_port.constrained_params',
    'constrain_params_at_use': 'nnx_port.constrained_params',
    'PathRule': 'converters.paths',
    'PathMapping': 'converters.paths',
    'Infer': 'converters.paths',
    'Rearrange': 'converters.transforms',
    'infer_paths': 'converters.inference',
    'KIT_PATHS': 'converters.presets',
    'GUIDE_PATHS': 'converters.presets',
    'GUIDE_LOGICAL_PATHS': 'converters.presets',
    'OptimizerCorrespondence': 'converters.optimizer_state',
    'register_optimizer': 'converters.optimizer_state',
    'ConversionError': 'converters.errors',
    'PathMappingError': 'converters.errors',
    'DisagreementError': 'converters.errors',
    'UndecidedError': 'converters.errors',
    'StructureError': 'converters.errors',
    'ShapeError': 'converters.errors',
    'AnnotationError': 'converters.errors',
    'LayoutError': 'converters.errors',
    'OptimizerStateError': 'converters.errors',
    'CheckpointError': 'converters.errors',
    'VerificationError': 'converters.errors',
    'ProcessMismatchError': 'converters.distributed',
    'LinenModel': 'converters.linen_model',
    'convert_checkpoint': 'converters.checkpoint.convert',
    'CheckpointOptions': 'converters.checkpoint.convert',
    'UserModels': 'converters.checkpoint.models',
    'ModelPair': 'converters.checkpoint.models',
    'compare_checkpoints': 'converters.checkpoint.compare',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
