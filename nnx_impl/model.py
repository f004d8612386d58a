"""The DotReluDot MLP in Flax NNX, as in the NNX guide "Scale up on multiple devices".

`DotReluDot` is one layer: an `nnx.Linear` whose kernel is sharded
`(None, 'model')` and a `w2` `nnx.Param` sharded `('model', None)` through its
`out_sharding` metadata, with sharding constraints on both activations. `MLP`
repeats it `num_layers` times, in an `nnx.List` or stacked: created with
`nnx.split_rngs` + `nnx.vmap` and run with `nnx.scan`, both with
`transform_metadata={nnx.PARTITION_NAME: ...}` so that the stacked layer axis
name is inserted into every parameter's `out_sharding`. Logical names carry the
description's rules as `sharding_rules` metadata (`nnx.with_metadata`).
The parameters are `ConstrainedParam`s: constrained to their annotation at
every use, as Linen's boxes are, so that both compile to one program.

Creation and tracing need the mesh in context (`with jax.set_mesh(mesh):`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from kit_mlp.description import ModelDescription
from nnx_port.constrained_params import ConstrainedParam, constrain_params_at_use


# [side-by-side: logical-names]
def _metadata(desc: ModelDescription, names) -> dict:
  """The sharding metadata of a parameter annotated with `names`."""
  if desc.logical:
    return {'out_sharding': names, 'sharding_rules': desc.rules}
  return {'out_sharding': names}
# [/side-by-side]


# [side-by-side: activation-constraints]
def _constrain(desc: ModelDescription, x: jax.Array, names) -> jax.Array:
  # NNX has no logical constraint of its own; `desc.resolve` resolves logical
  # names as Linen does (the first rule to claim a still-free mesh axis wins).
  return jax.lax.with_sharding_constraint(x, P(*desc.resolve(names)))
# [/side-by-side]


# [side-by-side: annotate-params]
class DotReluDot(nnx.Module):
  """`relu(x @ dot1.kernel) @ w2`."""

  def __init__(self, desc: ModelDescription, *, rngs: nnx.Rngs):
    self.desc = desc
    axes, dtype = desc.axes, desc.jnp_dtype
    init = nnx.initializers.lecun_normal()
    # Linen's boxes constrain a parameter at each use; NNX's do not, and XLA
    # may then shard a gradient, and its reduction, otherwise. These do.
    self.dot1 = constrain_params_at_use(nnx.Linear(
        desc.depth,
        desc.depth,
        kernel_init=nnx.with_metadata(init, **_metadata(desc, axes.kernel)),
        use_bias=False,
        dtype=dtype,
        param_dtype=dtype,
        rngs=rngs,
    ))
    self.w2 = ConstrainedParam(
        init(rngs.params(), (desc.depth, desc.depth), dtype),
        **_metadata(desc, axes.w2),
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    y = self.dot1(x)
    y = jax.nn.relu(y)
    y = _constrain(self.desc, y, self.desc.axes.hidden)
    z = jnp.dot(y, self.w2[...])
    return _constrain(self.desc, z, self.desc.axes.output)
# [/side-by-side]


# [side-by-side: scan-vs-loop]
class MLP(nnx.Module):
  """`num_layers` DotReluDot layers, looped (`nnx.List`) or stacked and scanned."""

  def __init__(self, desc: ModelDescription, *, rngs: nnx.Rngs):
    self.desc = desc
    if desc.use_scan:
      transform_metadata = {nnx.PARTITION_NAME: desc.layer_partition}

      @nnx.split_rngs(splits=desc.num_layers)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata=transform_metadata)
      def create_layers(rngs: nnx.Rngs) -> DotReluDot:
        return DotReluDot(desc, rngs=rngs)

      self.layers = create_layers(rngs)
    else:
      self.layers = nnx.List(
          [DotReluDot(desc, rngs=rngs) for _ in range(desc.num_layers)]
      )

  def __call__(self, x: jax.Array) -> jax.Array:
    if self.desc.use_scan:
      transform_metadata = {nnx.PARTITION_NAME: self.desc.layer_partition}

      @nnx.scan(
          in_axes=(nnx.Carry, 0),
          out_axes=nnx.Carry,
          transform_metadata=transform_metadata,
      )
      def forward(x: jax.Array, layer: DotReluDot) -> jax.Array:
        return layer(x)

      return forward(x, self.layers)
    for layer in self.layers:
      x = layer(x)
    return x
# [/side-by-side]
