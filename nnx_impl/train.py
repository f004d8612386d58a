"""Sharded creation, training and inference of the NNX MLP.

Creation follows the Flax 0.12 guide: inside `nnx.jit` under `jax.set_mesh`,
the model is built and eager sharding (on by default) shards every annotated
Variable as it is created; stacked layers are constrained once more, since
the layer axis `nnx.vmap` adds is not applied to them. The optimizer, built
from the sharded model, copies each parameter's annotation to its moments.
No array is ever whole on one device. `nnx.get_abstract_model` gives the
abstract model and optimizer that restores and the shardings start from.

The hot path does not pay `nnx.jit`'s graph traversal per call: the model and
optimizer are split once into a graphdef and an abstract state, and
`train_step`, `train_steps` and `apply` are `jax.jit` functions over the bare
arrays (`nnx.to_pure_dict`) that `nnx.merge` the objects back inside the trace.
`train_steps` runs several steps in one call with `nnx.scan` over steps.

All functions here expect the mesh in context: `with jax.set_mesh(mesh):`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import traversals
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kit_mlp.data import batch_sharding
from kit_mlp.description import ModelDescription
from kit_mlp.optimizers import FSDP_SGD_DECAY, DEFAULT_LEARNING_RATE, make_tx
from nnx_impl.model import MLP
from nnx_impl.sgd import SGD


# [side-by-side: optimizer-state]
def make_optimizer(
    model: MLP, optimizer: str, learning_rate: float = DEFAULT_LEARNING_RATE
) -> nnx.Optimizer | SGD:
  """`nnx.Optimizer(model, tx, wrt=nnx.Param)`, or the FSDP example's SGD."""
  if optimizer == 'fsdp_sgd':
    return SGD(model, learning_rate, decay=FSDP_SGD_DECAY)
  return nnx.Optimizer(model, make_tx(optimizer, learning_rate), wrt=nnx.Param)
# [/side-by-side]


# [side-by-side: sharded-creation]
def create_sharded(
    desc: ModelDescription, optimizer: str, key: jax.Array | int = 0
) -> tuple[MLP, nnx.Optimizer | SGD]:
  """Builds the model and its optimizer with every array in its shards.

  Each annotated Variable is sharded as it is created (eager sharding), so
  this needs the mesh in context: call it inside `nnx.jit` under
  `jax.set_mesh` (see `NNXTrainer.create`) or through `nnx.get_abstract_model`.
  """
  model = MLP(desc, rngs=nnx.Rngs(key))
  if desc.use_scan:
    # `nnx.vmap` creates each layer sharded, but the layer axis its
    # `transform_metadata` adds to the annotations is not applied to the
    # stacked arrays (Flax 0.12): constrain them to their annotations.
    state = nnx.state(model)
    nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
  return model, make_optimizer(model, optimizer)
# [/side-by-side]


def train_state(model: MLP, optimizer: nnx.Optimizer | SGD) -> nnx.State:
  """The state of `{'model': ..., 'optimizer': ...}`, metadata included."""
  return nnx.state({'model': model, 'optimizer': optimizer})


@dataclasses.dataclass(frozen=True)
class NNXTrainer:
  """The jitted functions of one description, mesh and optimizer.

  The jitted functions take and return the *arrays* of the training state: the
  pure nested dict `nnx.to_pure_dict(train_state(model, optimizer))`. The
  metadata (`out_sharding`, `sharding_rules`, Variable types) stays in
  `abstract_state` and is put back by `to_state` / `merge` inside the trace,
  so a call flattens a plain dict of arrays and pays no Variable bookkeeping.

  Attributes:
    desc: the model description.
    mesh: the `('data', 'model')` mesh the arrays live on.
    optimizer: an `kit_mlp.optimizers.OPTIMIZERS` name.
    graphdef: the static structure of `{'model': ..., 'optimizer': ...}`.
    abstract_state: the `train_state` of the model and optimizer made by
      `nnx.get_abstract_model`, holding sharded `ShapeDtypeStruct`s; the
      target of restores and the template of `to_state`.
    sharding: the `NamedSharding` of every array, as a pure dict.
  """

  desc: ModelDescription
  mesh: Mesh
  optimizer: str
  graphdef: nnx.GraphDef
  abstract_state: nnx.State
  sharding: dict

  # [side-by-side: sharded-creation]
  @functools.cached_property
  def _jit_create(self):
    return nnx.jit(create_sharded, static_argnums=(0, 1))
  # [/side-by-side]

  # [side-by-side: sharded-creation]
  def create(self, seed: int = 0) -> dict:
    """New training-state arrays, every array created directly in its shards."""
    model, optimizer = self._jit_create(
        self.desc, self.optimizer, jax.random.key(seed)
    )
    return nnx.to_pure_dict(train_state(model, optimizer))
  # [/side-by-side]

  def to_state(self, arrays: dict) -> nnx.State:
    """The `nnx.State` (Variables with their metadata) holding `arrays`."""
    wanted = {path for path, _ in nnx.to_flat_state(self.abstract_state)}
    given = set(traversals.flatten_mapping(arrays))
    if wanted != given:
      raise ValueError(
          'arrays do not match the training state: missing '
          f'{sorted(wanted - given)}, unexpected {sorted(given - wanted)}'
      )
    state = jax.tree.map(
        lambda v: v, self.abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    nnx.replace_by_pure_dict(state, arrays)
    return state

  def merge(self, arrays: dict) -> tuple[MLP, nnx.Optimizer | SGD]:
    """The `(model, optimizer)` objects holding `arrays`."""
    objects = nnx.merge(self.graphdef, self.to_state(arrays))
    return objects['model'], objects['optimizer']

  # [side-by-side: train-step]
  def loss_fn(self, model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    pred = model(x)
    return jnp.mean((pred.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)
  # [/side-by-side]

  # [side-by-side: train-step]
  def step_fn(self, model: MLP, optimizer, x: jax.Array, y: jax.Array):
    loss, grads = nnx.value_and_grad(self.loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss
  # [/side-by-side]

  # [side-by-side: train-step]
  @functools.cached_property
  def train_step(self):
    """`(arrays, x, y) -> (arrays, loss)`, jitted; donates `arrays`."""

    def step(arrays, x, y):
      model, optimizer = self.merge(arrays)
      loss = self.step_fn(model, optimizer, x, y)
      return nnx.to_pure_dict(train_state(model, optimizer)), loss

    data = batch_sharding(self.desc, self.mesh)
    return jax.jit(
        step,
        in_shardings=(self.sharding, data, data),
        out_shardings=(self.sharding, NamedSharding(self.mesh, P())),
        donate_argnums=0,
    )
  # [/side-by-side]

  # [side-by-side: several-steps]
  @functools.cached_property
  def train_steps(self):
    """`(arrays, xs, ys) -> (arrays, losses)`: one step per leading index of xs."""

    def steps(arrays, xs, ys):
      model, optimizer = self.merge(arrays)

      @nnx.scan(in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
      def body(carry, x, y):
        model, optimizer = carry
        return carry, self.step_fn(model, optimizer, x, y)

      _, losses = body((model, optimizer), xs, ys)
      return nnx.to_pure_dict(train_state(model, optimizer)), losses

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
    """`(arrays, x) -> y`, jitted; `y` is sharded `('data', None)`."""

    def apply(arrays, x):
      model, _ = self.merge(arrays)
      return model(x)

    data = batch_sharding(self.desc, self.mesh)
    return jax.jit(apply, in_shardings=(self.sharding, data), out_shardings=data)
  # [/side-by-side]


# [side-by-side: sharded-creation]
def abstract_state(
    desc: ModelDescription, mesh: Mesh, optimizer: str
) -> tuple[nnx.GraphDef, nnx.State]:
  """The graphdef and abstract state of the creation, each leaf a sharded `ShapeDtypeStruct`."""

  def create() -> dict:
    model, opt = create_sharded(desc, optimizer)
    return {'model': model, 'optimizer': opt}

  return nnx.get_abstract_model(create, mesh)
# [/side-by-side]


# [side-by-side: sharded-creation]
def make_trainer(desc: ModelDescription, mesh: Mesh, optimizer: str) -> NNXTrainer:
  """Traces the creation abstractly and derives the graphdef and shardings."""
  graphdef, abstract = abstract_state(desc, mesh, optimizer)
  with jax.set_mesh(mesh):
    sharding = nnx.to_pure_dict(nnx.get_named_sharding(abstract, mesh))
  return NNXTrainer(desc, mesh, optimizer, graphdef, abstract, sharding)
# [/side-by-side]
