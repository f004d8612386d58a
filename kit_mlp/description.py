"""The model description shared by the Linen and NNX implementations.

A `ModelDescription` fixes everything both frameworks need to build the same
sharded DotReluDot MLP: layer count, width, batch, scanned or looped layers, the
partition name of the stacked layer axis, the annotation style (mesh axis names,
or logical names plus rules), the mesh shape and the dtype. It validates itself
on construction, so a bad combination fails before any array is created, with a
message that names the value to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh

MESH_AXES = ('data', 'model')

#: Logical rules of the official guides, plus the stacked layer axis.
GUIDE_RULES = (('batch', 'data'), ('hidden', 'model'), ('embed', None), ('layer', None))
#: FSDP-style rules in the spirit of the NNX FSDP toy example's `MeshRules`:
#: the embed dimension of every weight is also sharded over `data`.
FSDP_RULES = (('batch', 'data'), ('hidden', 'model'), ('embed', 'data'), ('layer', None))
RULE_SETS = {'guide': GUIDE_RULES, 'fsdp': FSDP_RULES}

DTYPES = ('float32', 'bfloat16')


@dataclasses.dataclass(frozen=True)
class AxisNames:
  """The sharding annotation of each parameter and activation of DotReluDot."""

  kernel: tuple[str | None, ...]  # the first Dense/Linear kernel, (in, hidden)
  w2: tuple[str | None, ...]  # the second weight, (hidden, in)
  hidden: tuple[str | None, ...]  # activation after the first matmul
  output: tuple[str | None, ...]  # activation after the second matmul


#: Mesh axis names, as in the guides' `DotReluDot`.
DEVICE_AXES = AxisNames(
    kernel=(None, 'model'),
    w2=('model', None),
    hidden=('data', 'model'),
    output=('data', None),
)
#: Logical names, as in the guides' `LogicalDotReluDot`.
LOGICAL_AXES = AxisNames(
    kernel=('embed', 'hidden'),
    w2=('hidden', 'embed'),
    hidden=('batch', 'hidden'),
    output=('batch', 'embed'),
)


class InvalidDescriptionError(ValueError):
  """A `ModelDescription` whose values cannot describe a sharded model."""


@dataclasses.dataclass(frozen=True)
class ModelDescription:
  """One MLP, described once for both frameworks.

  Attributes:
    num_layers: number of DotReluDot layers (>= 1).
    depth: width of every layer; inputs and outputs are `(batch, depth)`.
    batch: global batch size of the training and evaluation inputs.
    use_scan: stack the layers along a leading axis and scan over them.
    layer_partition: partition name of the stacked layer axis: `None`
      (replicated) or a mesh axis name (device annotations) or a logical name
      that `rules` maps (logical annotations).
    annotation: `'device'` (mesh axis names) or `'logical'` (logical names
      resolved by `rules`).
    rules: logical-to-mesh rules; used only when `annotation == 'logical'`.
    mesh_shape: `(data, model)` sizes of the device mesh.
    dtype: parameter and computation dtype, `'float32'` or `'bfloat16'`.
  """

  num_layers: int = 4
  depth: int = 1024
  batch: int = 8
  use_scan: bool = False
  layer_partition: str | None = None
  annotation: str = 'device'
  rules: tuple[tuple[str, str | None], ...] = GUIDE_RULES
  mesh_shape: tuple[int, int] = (2, 4)
  dtype: str = 'float32'

  def __post_init__(self):
    object.__setattr__(self, 'mesh_shape', tuple(self.mesh_shape))
    object.__setattr__(self, 'rules', tuple(tuple(r) for r in self.rules))
    for problem in self._problems():
      raise InvalidDescriptionError(problem)

  # -- derived values ----------------------------------------------------------

  @property
  def logical(self) -> bool:
    return self.annotation == 'logical'

  @property
  def axes(self) -> AxisNames:
    """The annotation of every parameter and activation, in this style."""
    return LOGICAL_AXES if self.logical else DEVICE_AXES

  @property
  def sharding_rules(self) -> tuple[tuple[str, str | None], ...] | None:
    """The rules to attach to logical annotations, or None for device ones."""
    return self.rules if self.logical else None

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def data_size(self) -> int:
    return self.mesh_shape[0]

  @property
  def model_size(self) -> int:
    return self.mesh_shape[1]

  def replace(self, **changes) -> ModelDescription:
    return dataclasses.replace(self, **changes)

  def mesh_axis(self, name: str | None) -> str | None:
    """The mesh axis one annotation name resolves to on its own.

    Right for the parameters, whose dimensions never compete for a mesh axis
    (validation refuses that); an activation's names can, so use `resolve`.
    """
    if name is None or not self.logical:
      return name
    for logical_name, mesh_axis in self.rules:
      if logical_name == name:
        return mesh_axis
    raise InvalidDescriptionError(f'logical name {name!r} has no rule')

  def resolve(self, names: Sequence[str | None]) -> tuple[str | None, ...]:
    """The mesh axes of a whole annotation, as Linen resolves it.

    Linen walks the rules in order and gives a dimension its rule's mesh axis
    if no dimension holds that axis yet: the first rule to claim a free axis
    wins, whatever the order of the dimensions. With rules that send 'batch'
    and 'embed' to 'data', `('batch', 'embed')` resolves to `('data', None)`
    if the 'batch' rule comes first and to `(None, 'data')` otherwise.
    """
    if not self.logical:
      return tuple(names)
    return tuple(nn.logical_to_mesh_axes(names, self.rules))

  def make_mesh(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """An Auto-axis `('data', 'model')` mesh of `mesh_shape` over `devices`."""
    devices = jax.devices() if devices is None else list(devices)
    needed = self.mesh_shape[0] * self.mesh_shape[1]
    if len(devices) < needed:
      raise InvalidDescriptionError(
          f'mesh_shape={self.mesh_shape} needs {needed} devices but only '
          f'{len(devices)} are available; change mesh_shape, or on CPU set '
          f'XLA_FLAGS=--xla_force_host_platform_device_count={needed} before '
          'importing jax'
      )
    grid = np.asarray(devices[:needed], dtype=object).reshape(self.mesh_shape)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))

  # -- validation --------------------------------------------------------------

  def _problems(self):
    """Yields a message for each invalid value, the first one first."""
    ints = ('num_layers', 'depth', 'batch')
    for name in ints:
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        yield f'{name} must be an int, got {value!r}'
    if self.num_layers < 1:
      yield f'num_layers={self.num_layers}: set num_layers to 1 or more'
    if self.depth < 1 or self.batch < 1:
      yield f'depth={self.depth}, batch={self.batch}: both must be >= 1'
    if (
        len(self.mesh_shape) != 2
        or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in self.mesh_shape)
    ):
      yield (
          f'mesh_shape={self.mesh_shape!r}: give two positive sizes '
          f'(data, model) for the mesh axes {MESH_AXES}'
      )
      return
    if self.annotation not in ('device', 'logical'):
      yield f"annotation={self.annotation!r}: use 'device' or 'logical'"
      return
    if self.dtype not in DTYPES:
      yield f'dtype={self.dtype!r}: use one of {DTYPES}'
    if not self.use_scan and self.layer_partition is not None:
      yield (
          f'layer_partition={self.layer_partition!r} only applies to scanned '
          'layers: set use_scan=True or layer_partition=None'
      )
    yield from self._rule_problems()
    yield from self._repeated_axis_problems()
    yield from self._divisibility_problems()

  def _rule_problems(self):
    if not self.logical:
      if self.layer_partition is not None and self.layer_partition not in MESH_AXES:
        yield (
            f'layer_partition={self.layer_partition!r} is not a mesh axis '
            f'{MESH_AXES}; with device annotations use None or a mesh axis '
            "(or use annotation='logical' with a rule for it)"
        )
      return
    seen = set()
    for rule in self.rules:
      if len(rule) != 2 or not isinstance(rule[0], str):
        yield f'rules: {rule!r} is not a (logical_name, mesh_axis) pair'
        continue
      logical_name, mesh_axis = rule
      if mesh_axis is not None and mesh_axis not in MESH_AXES:
        yield (
            f'rules: ({logical_name!r}, {mesh_axis!r}) names mesh axis '
            f'{mesh_axis!r}, which the mesh {MESH_AXES} lacks; map '
            f'{logical_name!r} to one of {MESH_AXES} or None'
        )
      if logical_name in seen:
        # Linen takes the first free rule, NNX the last: ambiguous across them.
        yield (
            f'rules: {logical_name!r} has more than one rule; keep one, since '
            'Linen and NNX resolve repeated rules differently'
        )
      seen.add(logical_name)
    needed = set(LOGICAL_AXES.kernel + LOGICAL_AXES.w2 + LOGICAL_AXES.output)
    if self.layer_partition is not None:
      needed.add(self.layer_partition)
    for name in sorted(needed - seen):
      # NNX passes an unruled name through as a mesh axis; Linen replicates it.
      yield (
          f'rules: logical name {name!r} has no rule; add ({name!r}, None) '
          f'or ({name!r}, <mesh axis>) to rules'
      )

  def _repeated_axis_problems(self):
    layer = (self.layer_partition,) if self.use_scan else ()
    for param, names in (('kernel', self.axes.kernel), ('W2', self.axes.w2)):
      axes = [self.mesh_axis(n) for n in layer + names]
      repeated = sorted({a for a in axes if a is not None and axes.count(a) > 1})
      if repeated:
        yield (
            f'the {param} annotation {layer + names} puts mesh axis '
            f'{repeated[0]!r} on two dimensions; change layer_partition or '
            'the rules so each mesh axis shards one dimension'
        )
        return

  def _divisibility_problems(self):
    sizes = dict(zip(MESH_AXES, self.mesh_shape))
    params = self.axes.kernel + self.axes.w2
    dims = {
        'depth': (self.depth, zip(params, map(self.mesh_axis, params))),
        'batch': (self.batch, [(self.axes.output[0], self.resolve(self.axes.output)[0])]),
    }
    if self.use_scan and self.layer_partition is not None:
      dims['num_layers'] = (
          self.num_layers, [(self.layer_partition, self.mesh_axis(self.layer_partition))]
      )
    for value_name, (value, named_axes) in dims.items():
      for name, axis in named_axes:
        if axis is not None and value % sizes[axis]:
          yield (
              f'{value_name}={value} is not divisible by the {axis!r} mesh '
              f'axis of size {sizes[axis]} (annotation {name!r}); change '
              f'{value_name} to a multiple of {sizes[axis]} or change '
              'mesh_shape'
          )
          break
