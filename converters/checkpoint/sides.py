"""The two sides of a checkpoint conversion, each traced abstractly, and the plan joining them.

A `Side` is one framework's training state (or its weights) as the models
give it: the tree of `ShapeDtypeStruct`s the checkpoint holds, with their
shardings. A `CheckpointPlan` is what a conversion needs of the models: the
source and target sides, the path mapping, the rules and how the optimizer
states correspond. `converters.checkpoint.models` builds both from the
user's models; the conversions (`training_states`, `recipes`, `weights`)
read them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from converters.optimizer_state import OptimizerCorrespondence
from converters.paths import Framework, PathMapping


@dataclasses.dataclass(frozen=True)
class Side:
  """One side of a conversion: a framework's training state, or its weights, traced abstractly.

  Attributes:
    framework: 'linen' or 'nnx'.
    abstract_state: the tree of `ShapeDtypeStruct`s with their shardings that
      the checkpoint holds: what the ordinary Orbax restore fills (a training
      state: Linen's boxed `TrainState`, NNX's `nnx.State` of model and
      optimizer; weights only: see `converters.checkpoint.weights`).
    graphdef: NNX only, the static structure of `{'model', 'optimizer'}`
      (of the model alone for weights).
    layout: 'scan', 'loop' or None (no layer the path mapping stacks).
    what: how to name the model in messages.
    layer_partition: the layer axis name to insert when stacking into this
      side, when its own annotations do not give it (the kit's MLP).
    form: 'train_state', or the form of weights only (`weights.FORMS`).
    pure: weights stored without boxes (Linen) or as a pure dict (NNX).
    standard: weights only, the standard form (Linen's boxed variables,
      NNX's `nnx.state(model)`) that the stored arrays are read into.
  """

  framework: Framework
  abstract_state: Any
  graphdef: Any = None
  layout: str | None = None
  what: str = 'model'
  layer_partition: str | None = None
  form: str = 'train_state'
  pure: bool = False
  standard: Any = None

  @property
  def weights(self) -> bool:
    """Whether this side holds weights only (no optimizer state)."""
    return self.form != 'train_state'

  def objects(self, state: Any = None) -> tuple[Any, Any]:
    """NNX: `(model, optimizer)` of `state` (abstract when None); for
    weights, `(model, None)` of the standard form."""
    if self.weights:
      return nnx.merge(self.graphdef, self.standard if state is None else state), None
    merged = nnx.merge(self.graphdef, self.abstract_state if state is None else state)
    return merged['model'], merged['optimizer']


@dataclasses.dataclass(frozen=True)
class CheckpointPlan:
  """Everything a checkpoint conversion needs to know about the models.

  Attributes:
    mesh: the mesh to read, convert and write on.
    source: the side the checkpoint holds, in its layout.
    target: the side to write.
    other: when source and target are one framework, the other framework in
      the target's layout, to convert through; else None.
    paths: the Linen <-> NNX path mapping.
    rules: the logical rules to convert under (None: the annotations' own).
    correspondence: how the NNX optimizer's state maps to the optax state.
    collections: `{Linen collection: nnx.Variable subclass}` for collections
      beyond `params`, `batch_stats` and `cache` (see `linen_to_nnx`).
  """

  mesh: Mesh
  source: Side
  target: Side
  other: Side | None
  paths: PathMapping
  rules: tuple | None
  correspondence: OptimizerCorrespondence
  collections: Mapping[str, type] | None = None
