"""`Options`: what every conversion is told, checked when made.

The facades (`converters.api`) document each option; every stage of the
pipeline (plan, check, execute, fill) reads them from here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import linen as nn
from jax.sharding import Mesh

from converters.errors import AnnotationError, LayoutError, PathMappingError, StructureError
from converters.paths import PathMapping

__all__ = ['Options']


#: What `Options.placement` takes.
PLACEMENTS = ('check', 'reshard')


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
  """What every conversion is told (`linen_to_nnx`, `nnx_to_linen`, `relayout`).

  Attributes:
    paths: the `PathMapping` of every collection, as
      `converters.resolution.resolve_mapping` decides it from a conversion's
      `paths=`: a `PathMapping` or any iterable of `PathRule`s as given; None
      keeps every parameter's path (`PathMapping.identity()`); `'infer'`
      derives it from what the two models compute (`converters.infer_paths`),
      `Infer(known_rules)` likewise with the rules you know taking precedence.
    scan: target layout of layer variables (True stacked, False looped,
      None as the source).
    layer_partition: layer axis name inserted when stacking.
    num_layers: expected number of layers, checked in every layout
      (inferred when None).
    mesh: the mesh of arrays that carry no `NamedSharding` (abstract trees).
    rules: logical rules for logical annotations that carry none; attached to
      the output (as `sharding_rules` / the box's rules) so it resolves alone.
      Without it, the rules of an enclosing `nn.logical_axis_rules(...)`
      resolve them (and are not attached: the output resolves as the input).
    donate: delete each input array that is relaid (stacked or sliced) as
      soon as its replacement exists, so a relayout holds one group of layers
      twice instead of the whole tree. The input must not be used afterwards.
      Every check runs before any array is deleted; only a failure while the
      arrays are being built (out of memory) can leave some deleted. Arrays
      whose layout does not change are never deleted (they are the output's),
      nor is any buffer that two input leaves share (tied weights).
    strict: refuse a collection whose leaves are partly boxed; by default a
      bare leaf beside boxed ones is replicated, as Linen's
      `get_partition_spec` reads it.
    placement: what to do with an input array placed other than its
      annotation says (a Linen model's `init` without `out_shardings` holds
      its arrays replicated, or on one device, while its boxes ask for
      shards). `'check'` refuses it, naming every such array; `'reshard'`
      first puts each input array where its annotation says, on its own
      mesh, else on `mesh`, else on the mesh of `jax.set_mesh` (a bare
      array on no mesh, replicated; a bare array on a mesh stays). The move
      deletes nothing (a moved array may share the input's buffer on a
      device it already held); with `donate`, as always, the input must not
      be used afterwards. The conversions default to `'reshard'` into a
      target (on the target's mesh), `'check'` without one.
    unplaced_stay: with `'reshard'`, an annotated array on no mesh, with no
      mesh to go to, stays where it is (into a target on no mesh) rather
      than being refused.

  A target's arrays must live on the input's mesh, and a converted leaf's
  annotation must resolve as the target's: the conversion checks, it never
  reshards to another annotation.
  """

  paths: PathMapping
  scan: bool | None = None
  layer_partition: str | None = None
  num_layers: int | None = None
  mesh: Mesh | None = None
  rules: tuple | None = None
  donate: bool = False
  strict: bool = False
  placement: str = 'check'
  unplaced_stay: bool = False
  #: The rules of an enclosing `nn.logical_axis_rules(...)`, read when made.
  context_rules: tuple | None = dataclasses.field(init=False, default=None)

  def __post_init__(self):
    context = tuple(tuple(r) for r in nn.get_logical_axis_rules() or ())
    object.__setattr__(self, 'context_rules', context or None)
    if not isinstance(self.paths, PathMapping):
      raise PathMappingError(
          f'Options(paths={self.paths!r}): give the resolved PathMapping '
          '(converters.resolution.resolve_mapping reads what paths= a conversion took)'
      )
    if self.scan not in (None, True, False):
      raise LayoutError(f'scan={self.scan!r}: pass True (stacked), False (looped) or None (as the source)')
    if self.num_layers is not None and (
        isinstance(self.num_layers, bool) or not isinstance(self.num_layers, (int, np.integer))
        or self.num_layers < 0
    ):
      raise LayoutError(f'num_layers={self.num_layers!r}: pass a non-negative int, or None to infer it')
    if self.layer_partition is not None and not isinstance(self.layer_partition, str):
      raise LayoutError(f'layer_partition={self.layer_partition!r}: pass an axis name (str) or None')
    if self.mesh is not None and not isinstance(self.mesh, Mesh):
      raise AnnotationError(f'mesh={self.mesh!r}: pass a jax.sharding.Mesh or None')
    if self.rules is not None:
      try:
        rules = tuple((name, axis) for name, axis in self.rules)
      except (TypeError, ValueError):
        raise AnnotationError(
            f'rules={self.rules!r}: pass logical rules as (name, mesh axis) pairs, '
            "e.g. (('embed', None), ('hidden', 'model'))"
        ) from None
      object.__setattr__(self, 'rules', rules)
    if not isinstance(self.donate, bool):
      raise StructureError(f'donate={self.donate!r}: pass True or False')
    if not isinstance(self.strict, bool):
      raise AnnotationError(f'strict={self.strict!r}: pass True or False')
    if self.placement not in PLACEMENTS:
      raise AnnotationError(
          f"placement={self.placement!r}: pass 'check' (refuse arrays placed against "
          "their annotations) or 'reshard' (put each where its annotation says)"
      )

  @property
  def resolution_rules(self) -> tuple | None:
    """What resolves logical names that carry no rules: `rules=`, else the context's."""
    return self.rules if self.rules is not None else self.context_rules

