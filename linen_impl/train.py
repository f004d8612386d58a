"""Sharded creation, training and inference of the Linen MLP.

Creation follows the Linen guide: `jax.eval_shape` of the init gives the boxed
abstract `TrainState`, `nn.get_sharding` (device axes) or `nn.get_partition_spec`
+ `nn.logical_to_mesh_sharding` (logical names) turns its annotations into
shardings, and `jax.jit(init, out_shardings=...)` creates every array directly in
its shards. `train_step` and `apply` are jitted with explicit in/out shardings;
`train_steps` runs several steps in one call with `jax.lax.scan` over steps.

All functions here expect the mesh in context: `with jax.set_mesh(mesh):`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax.training.train_state import TrainState
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kit_mlp.data import batch_sharding
from kit_mlp.description import ModelDescription
from linen_impl.model import MLP


# [side-by-side: sharded-creation]
def state_sharding(desc: ModelDescription, mesh: Mesh, abstract_state: Any) -> Any:
  """The `NamedSharding` of every leaf of a boxed (abstract) `TrainState`."""
  if desc.logical:
    specs = nn.get_partition_spec(abstract_state)
    return nn.logical_to_mesh_sharding(specs, mesh, desc.rules)
  return nn.get_sharding(abstract_state, mesh)
# [/side-by-side]


# [side-by-side: optimizer-state]
def init_train_state(
    desc: ModelDescription,
    model: MLP,
    tx: optax.GradientTransformation,
    key: jax.Array,
) -> TrainState:
  """`model.init` wrapped in a `TrainState`: what `jax.eval_shape` and `jax.jit` trace."""
  x = jnp.zeros((desc.batch, desc.depth), desc.jnp_dtype)
  variables = model.init(key, x)
  return TrainState.create(apply_fn=model.apply, params=variables['params'], tx=tx)
# [/side-by-side]


@dataclasses.dataclass(frozen=True)
class LinenTrainer:
  """The jitted functions of one description, mesh and optimizer.

  Attributes:
    desc: the model description.
    mesh: the `('data', 'model')` mesh the arrays live on.
    model: the Linen `MLP`.
    tx: the optax transform of the `TrainState`.
    abstract_state: the boxed `TrainState` of `ShapeDtypeStruct`s.
    sharding: the `NamedSharding` of every leaf of the state.
  """

  desc: ModelDescription
  mesh: Mesh
  model: MLP
  tx: optax.GradientTransformation
  abstract_state: TrainState
  sharding: TrainState

  # [side-by-side: sharded-creation]
  @functools.cached_property
  def _jit_create(self):
    init = functools.partial(init_train_state, self.desc, self.model, self.tx)
    return jax.jit(init, out_shardings=self.sharding)
  # [/side-by-side]

  # [side-by-side: sharded-creation]
  def create(self, seed: int = 0) -> TrainState:
    """A new `TrainState`, every array created directly in its shards."""
    return self._jit_create(jax.random.key(seed))
  # [/side-by-side]

  # [side-by-side: train-step]
  def loss_fn(self, params, x: jax.Array, y: jax.Array) -> jax.Array:
    pred = self.model.apply({'params': params}, x)
    return jnp.mean((pred.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)
  # [/side-by-side]

  # [side-by-side: train-step]
  def step_fn(self, state: TrainState, x: jax.Array, y: jax.Array):
    loss, grads = jax.value_and_grad(self.loss_fn)(state.params, x, y)
    return state.apply_gradients(grads=grads), loss
  # [/side-by-side]

  # [side-by-side: train-step]
  @functools.cached_property
  def train_step(self):
    """`(state, x, y) -> (state, loss)`, jitted; donates `state`."""
    data = batch_sharding(self.desc, self.mesh)
    return jax.jit(
        self.step_fn,
        in_shardings=(self.sharding, data, data),
        out_shardings=(self.sharding, NamedSharding(self.mesh, P())),
        donate_argnums=0,
    )
  # [/side-by-side]

  # [side-by-side: several-steps]
  @functools.cached_property
  def train_steps(self):
    """`(state, xs, ys) -> (state, losses)`: one step per leading index of xs."""

    def steps(state, xs, ys):
      def body(state, batch):
        return self.step_fn(state, *batch)

      return jax.lax.scan(body, state, (xs, ys))

    data = batch_sharding(self.desc, self.mesh, stacked=True)
    return jax.jit(
        steps,
        in_shardings=(self.sharding, data, data),
        out_shardings=(self.sharding, NamedSharding(self.mesh, P())),
        donate_argnums=0,
    )
  # [/side-by-side]

  # [side-by-side: apply]
  @functools.cached_property
  def apply(self):
    """`(params, x) -> y`, jitted; `y` is sharded `('data', None)`."""
    data = batch_sharding(self.desc, self.mesh)
    return jax.jit(
        lambda params, x: self.model.apply({'params': params}, x),
        in_shardings=(self.sharding.params, data),
        out_shardings=data,
    )
  # [/side-by-side]


# [side-by-side: sharded-creation]
def make_trainer(
    desc: ModelDescription, mesh: Mesh, tx: optax.GradientTransformation
) -> LinenTrainer:
  """Builds the model, traces its init abstractly and derives every sharding."""
  model = MLP(desc)
  init = functools.partial(init_train_state, desc, model, tx)
  with jax.set_mesh(mesh):
    abstract = jax.eval_shape(init, jax.random.key(0))
  return LinenTrainer(
      desc, mesh, model, tx, abstract, state_sharding(desc, mesh, abstract)
  )
# [/side-by-side]
