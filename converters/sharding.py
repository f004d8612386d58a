"""Where a conversion's arrays live: meshes, inputs placed, targets' shardings, scalars.

A leaf's mesh is its array's (a `NamedSharding`), else its annotation's,
else the one the conversion is given (`mesh=`, or `jax.set_mesh`'s:
`placement_mesh`). `place_inputs` puts each input array where its annotation
says (`placement='reshard'`); `target_shardings` resolves each target's
annotation (`converters.metadata.resolve`) on the mesh its sources share, the
`NamedSharding` the built array takes; `place_scalar` places an optimizer
scalar replicated; `linen_sharding` is Linen's own resolution of a boxed leaf
(what the checkpoint tool shards a Linen training state with). `converters.checks` refuses what is misplaced; this module
says where things go.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from converters import metadata as md
from converters import provenance, relayout_ops
from converters.errors import AnnotationError, LayoutError, LeafErrors, format_offenders
from converters.metadata import is_linen_box
from converters.paths import format_path
from converters.planning import Flat, Target


def mesh_of(value) -> Mesh | None:
  """The mesh of an array with a `NamedSharding`, else None."""
  sharding = getattr(value, 'sharding', None)
  return sharding.mesh if isinstance(sharding, NamedSharding) else None


def leaf_mesh(value, annotation: md.Annotation, mesh: Mesh | None) -> Mesh | None:
  """The mesh a leaf lives on: its array's, else its annotation's, else `mesh`."""
  own = mesh_of(value)
  if own is not None:
    return own
  return annotation.mesh if annotation.mesh is not None else mesh


def describe_mesh(mesh) -> str:
  """`{'data': 2, 'model': 4} on devices [...]` (no devices for an abstract mesh)."""
  devices = f' on devices {[d.id for d in mesh.devices.flat]}' if isinstance(mesh, Mesh) else ''
  return f'{dict(mesh.shape)}{devices}'


def mesh_of_tree(flat) -> Mesh | None:
  """The mesh of the first leaf of `flat` that has a `NamedSharding`."""
  for value, *_ in flat.values():
    if (mesh := mesh_of(value)) is not None:
      return mesh
  return None


def placement_mesh(mesh: Mesh | None) -> Mesh | None:
  """`mesh`, else the mesh of an enclosing `jax.set_mesh`, else None."""
  if mesh is not None:
    return mesh
  context = jax.sharding.get_mesh()
  return context if isinstance(context, Mesh) and context.axis_names else None


def place_inputs(flat: Flat, mesh: Mesh | None, rules: tuple | None, *, unplaced_stay=False) -> Flat:
  """`flat` with each array put where its annotation says (`placement='reshard'`).

  An annotated array with a `NamedSharding` moves within its mesh; one
  without (on one device, a host array) goes to `mesh` (`placement_mesh`),
  a bare one replicated. A bare array already on a mesh stays as it is, and
  an array already in place is kept: no copy. Nothing of the input is
  deleted (a moved array may share its buffer on a device it already held);
  an abstract one gets the sharding.

  Raises:
    AnnotationError: an annotated array with no mesh to go to (unless
      `unplaced_stay`: it stays where it is).
  """
  placed, homeless = {}, []
  for path, (value, annotation) in flat.items():
    sharding = getattr(value, 'sharding', None)
    own = mesh_of(value)
    if own is not None and annotation.names is None:
      placed[path] = (value, annotation)  # a bare array says nothing against its placement
      continue
    on = leaf_mesh(value, annotation, mesh)
    if on is None or not hasattr(value, 'shape'):
      if annotation.names is not None and not isinstance(sharding, NamedSharding):
        homeless.append(format_path(path))
      placed[path] = (value, annotation)
      continue
    spec = (
        PartitionSpec() if annotation.names is None
        else md.resolve(annotation, tuple(value.shape), on, format_path(path), rules)
    )
    wanted = NamedSharding(on, spec)
    if isinstance(sharding, NamedSharding) and sharding.is_equivalent_to(wanted, len(value.shape)):
      placed[path] = (value, annotation)
    elif isinstance(value, jax.ShapeDtypeStruct):
      moved = jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=wanted)
      placed[path] = (provenance.record(moved, provenance.Derivation(relayout_ops.Keep(), (value,))), annotation)
    else:
      placed[path] = (jax.device_put(value, wanted), annotation)
  if homeless and not unplaced_stay:
    raise AnnotationError(
        f"placement='reshard' puts each array where its annotation says, but these "
        f'lie on no mesh and none is given: {format_offenders(homeless)}',
        homeless,
        fix='pass mesh=..., or convert inside jax.set_mesh(mesh)',
    )
  return placed


def target_shardings(
    targets: Mapping[tuple, Target],
    flat: Flat,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
) -> dict[tuple, NamedSharding | None]:
  """Checks every target annotation on its mesh; the `NamedSharding` each asks for.

  The sources of one target (a stack's layers) must live on one mesh.
  """
  shardings = {}
  errors = LeafErrors()  # every target that fails, named at once
  for path, t in targets.items():
    with errors.leaf():
      meshes = {}
      for source_path in t.sources:
        value, annotation = flat[source_path]
        on = leaf_mesh(value, annotation, mesh)
        if on is not None:
          meshes.setdefault(on, format_path(source_path))
      if len(meshes) > 1:
        listed = [f'{p} on {describe_mesh(m)}' for m, p in meshes.items()]
        raise LayoutError(
            f'{format_path(path)}: its sources live on different meshes or device '
            f'orders ({format_offenders(listed)}); put every layer on one mesh '
            '(jax.device_put) before converting',
            list(meshes.values()),
        )
      on = next(iter(meshes), None)
      try:
        spec = md.resolve(t.annotation, t.shape, on, format_path(path), rules)
      except AnnotationError as e:
        if t.transform is None:
          raise
        raise AnnotationError(
            f'{e} ({format_path(path)} is made from {format_path(t.sources[0])} by '
            f'{t.transform.rearrange!r}, and the sharding cannot follow it: give sizes '
            'the mesh divides, or convert with that name resolving to None (rules=...) '
            'and reshard after)',
            e.paths,
        ) from e
      shardings[path] = None if on is None else NamedSharding(on, spec)
  errors.raise_any()
  return shardings


def place_scalar(value, mesh: Mesh | None):
  """A scalar kept as it is: the input array itself, or placed replicated."""
  if isinstance(value, jax.ShapeDtypeStruct):
    sharding = NamedSharding(mesh, PartitionSpec()) if mesh else value.sharding
    return provenance.record(
        jax.ShapeDtypeStruct((), value.dtype, sharding=sharding),
        provenance.Derivation(relayout_ops.Keep(), (value,)),
    )
  if isinstance(value, jax.Array):
    return value
  array = np.asarray(value)
  return jax.device_put(array, NamedSharding(mesh, PartitionSpec())) if mesh else jnp.asarray(array)


def linen_sharding(mesh: Mesh, rules, leaf) -> NamedSharding:
  """Linen's own resolution of one leaf: mesh-axis boxes by their names,
  logical ones by their rules (else `rules`), bare leaves replicated.

  (`nn.get_sharding` reads a `LogicallyPartitioned` box's logical names as
  mesh axes, so logical boxes go through `nn.logical_to_mesh_sharding`.)
  """
  if isinstance(leaf, nn.LogicallyPartitioned):
    own = leaf.rules if leaf.rules is not None else rules
    return nn.logical_to_mesh_sharding(leaf.get_partition_spec(), mesh, own)
  if is_linen_box(leaf):
    return leaf.get_sharding(mesh)
  return NamedSharding(mesh, PartitionSpec())
