"""The DotReluDot MLP in Flax Linen, as in the guide "Scale up Flax Modules on multiple devices".

`DotReluDot` is one layer: a `nn.Dense` whose kernel is sharded `(None, 'model')`
and a `W2` weight sharded `('model', None)`, with sharding constraints on both
activations. `MLP` repeats it `num_layers` times, in a Python loop or with
`nn.scan`, whose `metadata_params` inserts the stacked layer axis name into every
parameter's annotation. Device-axis annotations use `nn.with_partitioning` and
`jax.lax.with_sharding_constraint`; logical ones `nn.with_logical_partitioning`
and `nn.with_logical_constraint`, with the description's rules in the boxes.

Tracing needs the mesh in context (`with jax.set_mesh(mesh):`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from kit_mlp.description import ModelDescription


# [side-by-side: logical-names]
def _annotate_init(desc: ModelDescription, names):
  """The kernel initializer wrapped in this description's annotation style."""
  init = nn.initializers.lecun_normal()
  if desc.logical:
    return nn.with_logical_partitioning(init, names, rules=desc.rules)
  return nn.with_partitioning(init, names)
# [/side-by-side]


# [side-by-side: activation-constraints]
def _constrain(desc: ModelDescription, x: jax.Array, names) -> jax.Array:
  if desc.logical:
    return nn.with_logical_constraint(x, names, rules=desc.rules)
  return jax.lax.with_sharding_constraint(x, P(*names))
# [/side-by-side]


# [side-by-side: annotate-params]
class DotReluDot(nn.Module):
  """`relu(x @ kernel) @ W2`, returning `(z, None)` so that `nn.scan` can carry it."""

  desc: ModelDescription

  @nn.compact
  def __call__(self, x: jax.Array, _=None):
    desc, axes = self.desc, self.desc.axes
    y = nn.Dense(
        desc.depth,
        kernel_init=_annotate_init(desc, axes.kernel),
        use_bias=False,
        dtype=desc.jnp_dtype,
        param_dtype=desc.jnp_dtype,
    )(x)
    y = jax.nn.relu(y)
    y = _constrain(desc, y, axes.hidden)
    w2 = self.param(
        'W2',
        _annotate_init(desc, axes.w2),
        (desc.depth, x.shape[-1]),
        desc.jnp_dtype,
    )
    z = jnp.dot(y, w2)
    z = _constrain(desc, z, axes.output)
    return z, None
# [/side-by-side]


# [side-by-side: scan-vs-loop]
class MLP(nn.Module):
  """`num_layers` DotReluDot layers, looped or scanned."""

  desc: ModelDescription

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    desc = self.desc
    if desc.use_scan:
      x, _ = nn.scan(
          DotReluDot,
          length=desc.num_layers,
          variable_axes={'params': 0},
          split_rngs={'params': True},
          metadata_params={nn.PARTITION_NAME: desc.layer_partition},
      )(desc)(x)
    else:
      for _ in range(desc.num_layers):
        x, _ = DotReluDot(desc)(x)
    return x
# [/side-by-side]
