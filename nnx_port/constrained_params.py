"""Parameters constrained at every use, as Linen's are: what a port needs to compile to its Linen original's program.

Linen's boxes (`Partitioned.unbox`, `LogicallyPartitioned.unbox`) wrap a
parameter in `with_sharding_constraint` each time a module reads it under a
mesh. An `nnx.Param` is read as it is, so XLA is free to give the parameter's
gradient another sharding and to partition its reduction differently: the
port then compiles to another program than the original, and its gradients can
differ from Linen's in the last bits (seen with `embed` sharded over the
contraction of the first matmul and the batch replicated). With
`ConstrainedParam` the reads are constrained as Linen's are, and the two
programs are the same.

    model = constrain_params_at_use(MyModel(..., rngs=nnx.Rngs(0)))

A `ConstrainedParam` is an `nnx.Param`: filters (`nnx.Param`,
`nnx.Optimizer(model, tx, wrt=nnx.Param)`), checkpoints and the conversions
treat it as one.
"""

from __future__ import annotations

from typing import TypeVar

import jax
from flax import nnx
from flax.nnx import spmd
from flax.typing import MISSING, Missing
from jax.sharding import AxisType, NamedSharding

__all__ = ['ConstrainedParam', 'constrain_params_at_use']

M = TypeVar('M')


def _constrained(variable: nnx.Variable, value):
  """`value` constrained to `variable`'s annotation, where Linen would constrain it."""
  if not isinstance(value, jax.core.Tracer):
    return value  # an eager read: the array already has its sharding
  metadata = variable.get_metadata()
  annotation = metadata.get('out_sharding')
  if not annotation:
    return value  # unannotated: replicated, as Linen reads a bare parameter
  if isinstance(annotation, jax.sharding.Sharding):  # placed by it, mesh and all
    return jax.lax.with_sharding_constraint(value, annotation)
  spec = spmd.get_var_pspec(variable)  # as `nnx.get_partition_spec` places it
  mesh = metadata.get('mesh')
  if mesh is not None:  # a mesh carried in the metadata, as a Linen box's `mesh`
    return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec))
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return value
  types = dict(zip(mesh.axis_names, mesh.axis_types))
  named = [a for axes in spec if axes is not None for a in (axes if isinstance(axes, tuple) else (axes,))]
  if any(types.get(a) != AxisType.Auto for a in named):
    return value  # explicit axes: the sharding is part of the value's type already
  return jax.lax.with_sharding_constraint(value, spec)


class ConstrainedParam(nnx.Param):
  """An `nnx.Param` whose value is constrained to its annotation on every traced read.

  The annotation is resolved as `nnx.get_partition_spec` resolves it (the
  `out_sharding` metadata, through `sharding_rules` or the context's logical
  axis rules), so the constraint never moves the parameter from where it was
  created; what it fixes is the sharding of the parameter's gradient, which
  the transposed constraint carries. Reads outside a traced function, and
  without a mesh, return the value as it is. Subclass it for parameter types
  of your own.
  """

  __slots__ = ()

  def get_value(self, *, index=MISSING):
    # The whole parameter is constrained, as Linen does, then indexed.
    value = _constrained(self, super().get_value())
    return value if isinstance(index, Missing) or index is ... else value[index]


def constrain_params_at_use(module: M) -> M:
  """`module` with every plain `nnx.Param` turned into a `ConstrainedParam`.

  Values, metadata and sharing are kept (a parameter reached by two paths stays
  one parameter); Variables of other types, subclasses of `nnx.Param`
  included, are left as they are. Call it on the built model, or inside
  `nnx.eval_shape`/`nnx.jit` on the abstract or sharded one.

  The result is a new module holding the same arrays, not copies: use it in
  place of `module` (donating its arrays deletes `module`'s too).
  """
  graphdef, state = nnx.split(module)
  state = nnx.map_state(
      lambda _, v: (
          ConstrainedParam.from_metadata(v.get_raw_value(), v.get_metadata())
          if type(v) is nnx.Param else v
      ),
      state,
  )
  return nnx.merge(graphdef, state)
