"""linen-nnx-kit's conversion library: Flax Linen <-> Flax NNX, for any model.

    from converters import linen_to_nnx, nnx_to_linen, PathRule, PathMapping, Rearrange
    from converters import convert_checkpoint, LinenModel   # checkpoints on disk

The public API is this module's names. The core, which knows no model: `api`
(the conversions), `paths` (the path mapping), `inference` (the path
mapping inferred from what two models compute), `linen_model` (a Linen
module with its example inputs), `transforms` (value
transforms of path rules: reshape, transpose, fuse/split), `metadata` (the neutral
sharding annotation), `layout` (path translation and scan <-> loop relayout),
`variable_types` (Linen collections <-> NNX Variable types), `tree_io`
(reading and writing both frameworks' trees), `optimizer_state` (optax state <-> NNX optimizers,
with a registry for optimizers of your own), `distributed` (agreement between
processes), `abstract_models` (users' NNX models created abstractly, guarded
against a Flax defect), `allocator` and `errors`. Above it: `converters.presets` (the
path mappings of published models), `converters.checkpoint` (inspect,
restore, convert, verify and compare checkpoints on disk) and
`converters.testing` (equivalence assertions for your CI).

May import: `nnx_port` (helpers an NNX port uses, re-exported here). The core
imports neither `linen_impl`, `nnx_impl`, `kit_mlp`, `model_zoo` nor `linen_nnx_cli`
(contracts in pyproject.toml, checked by `make test`).

Names are imported lazily, so that `linen_nnx_cli.devices` can set the
simulated device count before anything imports JAX. Modules that moved out in
the package split are still importable under their old names for one release,
with a `DeprecationWarning`.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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
    'StructureError': 'converters.errors',
    'ShapeError': 'converters.errors',
    'AnnotationError': 'converters.errors',
    'LayoutError': 'converters.errors',
    'OptimizerStateError': 'converters.errors',
    'CheckpointError': 'converters.errors',
    'VerificationError': 'converters.errors',
    'LinenModel': 'converters.linen_model',
    'convert_checkpoint': 'converters.checkpoint.convert',
    'compare_checkpoints': 'converters.checkpoint.compare',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


# Old module -> where it lives now (the package split of linen-nnx-kit 0.2).
_MOVED_MODULES = {
    'converters.checkpoints': 'converters.checkpoint.inspect',
    'converters.checkpoint_convert': 'converters.checkpoint.convert',
    'converters.verification': 'converters.checkpoint.verify',
    'converters.compare': 'converters.checkpoint.compare',
    'converters.training_states': 'converters.checkpoint.training_states',
    'converters.destination': 'converters.checkpoint.destination',
    'converters.processes': 'converters.distributed',
    'converters.constrained_params': 'nnx_port.constrained_params',
    'converters.description': 'kit_mlp.description',
    'converters.data': 'kit_mlp.data',
    'converters.optimizers': 'kit_mlp.optimizers',
    'converters.devices': 'linen_nnx_cli.devices',
    'converters.cli': 'linen_nnx_cli.main',
    'converters.demo': 'linen_nnx_cli.demo',
    'converters.plot': 'linen_nnx_cli.plot',
    'converters.progress': 'linen_nnx_cli.progress',
    'converters.report': 'converters.testing.tables',
    'converters.side_by_side': 'linen_nnx_cli.side_by_side',
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports a moved module under its old name: the new module, with a warning."""

  def __init__(self):
    self._specs = {}

  def find_spec(self, fullname, path=None, target=None):
    if _MOVED_MODULES.get(fullname) is None:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    new = _MOVED_MODULES[spec.name]
    warnings.warn(
        f'{spec.name} moved to {new}; import it from there', DeprecationWarning, stacklevel=2
    )
    module = importlib.import_module(new)
    self._specs[spec.name] = module.__spec__
    return module

  def exec_module(self, module):
    # The new module is already executed; the import system has just given it
    # the old name's spec: give it back its own.
    module.__spec__ = self._specs.pop(module.__spec__.name)


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
  sys.meta_path.append(_MovedModuleFinder())

# The catalogue registers the former default of `paths=` and its old names in
# `converters.paths` (deprecated, for one release). It imports no JAX.
importlib.import_module('converters.presets')
