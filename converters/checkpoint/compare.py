"""Leaf-by-leaf comparison of two training states, Linen and NNX paths side by side.

`compare_states` puts two training states in one form (each is converted to
a Linen `TrainState` in the first one's layout; a same-layout conversion copies
nothing) and compares every leaf on device: shape, dtype, the PartitionSpec of
the actual sharding, bit equality and the largest absolute difference. NNX
state Linen has none of (RNG state, state a one-sided rule says only the
port has) is compared between two NNX checkpoints. Each row names the leaf
on both sides, so `linen-nnx compare` can print the table
users read and CI checks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.training.train_state import TrainState
from jax.sharding import NamedSharding, PartitionSpec

from converters import metadata as md
from converters.checkpoint.inspect import string_path
from converters.comparison import as_key_data, leaf_difference
from converters.errors import CheckpointError
from converters.optimizer_state import NNX_OPTIMIZER, OptimizerCorrespondence
from converters.paths import PathMapping, format_path
from converters.training_mode import linen_draws_in_order, linen_in_training, nnx_draws_in_order, runs_a_scan
from converters.variable_types import CollectionTable

#: How a report names each framework.
_FRAMEWORK_NAMES = {'linen': 'Linen', 'nnx': 'NNX'}


@dataclasses.dataclass(frozen=True)
class LeafComparison:
  """One row of a comparison."""

  linen_path: str
  nnx_path: str
  shape: tuple[int, ...]
  dtype: str
  spec_a: str
  spec_b: str
  max_abs_diff: float
  identical: bool


def _spec(value) -> str:
  sharding = getattr(value, 'sharding', None)
  spec = getattr(sharding, 'spec', None)
  return str(tuple(spec)) if spec is not None else '-'


def _same_placement(a, b) -> bool:
  """Whether `a` and `b` are laid out alike on the devices: equivalent
  shardings, whatever their spelling (`P(None, None)` on a rank-3 array
  replicates it as `P(None, None, None)` does)."""
  sa, sb = getattr(a, 'sharding', None), getattr(b, 'sharding', None)
  if sa is None or sb is None:
    return sa is sb
  return sa.is_equivalent_to(sb, a.ndim)


def nnx_path_of(
    linen_path: tuple, paths: PathMapping, corr: OptimizerCorrespondence = NNX_OPTIMIZER,
    model: tuple = ('model',),
) -> str:
  """The NNX training-state path of a Linen `TrainState` leaf.

  Parameters (and a `TrainState` subclass's collections, such as
  `batch_stats`) map through `paths`, optimizer-state prefixes through the
  correspondence `corr` that `converters.optimizer_state` converts with; a
  Linen leaf the NNX optimizer derives from its step is shown as
  `(optimizer/step)`. `model` is where the model's state is (`()` for
  weights only: Linen variables and the model's own state).
  """
  keys = tuple(str(k) for k in linen_path)
  if keys == ('step',):
    return 'optimizer/step'
  if keys[-1:] == ('value',):
    keys = keys[:-1]  # the box's array; NNX paths name the Variable
  head, rest = keys[0], keys[1:]
  if head != 'opt_state':  # params, or a collection
    found = paths.match_all('linen', rest)
    if len(found) != 1:
      return '?'
    if found[0].rule.only == 'linen':
      return '(Linen only)'
    return format_path(model + found[0].rule.path('nnx', found[0].layout, found[0].index))
  typed = tuple(int(k) if k.isdigit() else k for k in rest)  # optax sequence indices
  if typed in corr.derived_from_step:
    return '(optimizer/step)'
  prefix, param = typed, ()
  for start in range(len(rest)):
    found = paths.match_all('linen', rest[start:])
    if len(found) == 1:
      prefix = typed[:start]
      param = found[0].rule.path('nnx', found[0].layout, found[0].index)
      break
  nnx_prefix = corr.nnx_prefix(prefix)
  return '?' if nnx_prefix is None else format_path(('optimizer',) + nnx_prefix + param)


def compare_linen_states(
    a: TrainState, b: TrainState, paths: PathMapping, corr: OptimizerCorrespondence = NNX_OPTIMIZER,
    model: tuple = ('model',),
) -> list[LeafComparison]:
  """Rows comparing two Linen `TrainState`s (or Linen variables, `model=()`)
  of the same structure."""
  flat_b = {
      string_path(k): v
      for k, v in jax.tree_util.tree_flatten_with_path(b, is_leaf=md.is_linen_box)[0]
  }
  rows = []
  for keypath, leaf_a in jax.tree_util.tree_flatten_with_path(a, is_leaf=md.is_linen_box)[0]:
    path = string_path(keypath)
    leaf_b = flat_b[path]
    where = format_path(path)
    value_a, value_b = md.read_linen(leaf_a, where)[0], md.read_linen(leaf_b, where)[0]
    same, diff = leaf_difference(value_a, value_b)
    spec_a, spec_b = _spec(value_a), _spec(value_b)
    rows.append(
        LeafComparison(
            linen_path=where,
            nnx_path=nnx_path_of(path, paths, corr, model),
            shape=tuple(value_a.shape),
            dtype=str(value_a.dtype),
            spec_a=spec_a,
            spec_b=spec_b,
            max_abs_diff=diff,
            identical=same and _same_placement(value_a, value_b),
        )
    )
  return rows


def rng_leaves(state) -> dict[str, jax.Array]:
  """`{path: array}` of the RNG state (`nnx.RngState`: dropout keys and
  counts) of an NNX training state; keys as their key data."""
  out = {}
  for path, variable in nnx.to_flat_state(state):
    if isinstance(variable, nnx.RngState):
      out[format_path(path)] = as_key_data(variable.get_raw_value())
  return out


def nnx_only_leaves(state, paths: PathMapping, model: tuple = ('model',)) -> dict[str, jax.Array]:
  """`{path: array}` of the model state only NNX has (a one-sided rule names
  it: a table Linen computes on the fly) in an NNX training state (`model`
  is where the model's state is; `()` for weights only)."""
  return {
      format_path(path): variable.get_raw_value()
      for path, variable in nnx.to_flat_state(state)
      if tuple(path[:len(model)]) == model and paths.only('nnx', tuple(path[len(model):]))
  }


def compare_nnx_state(
    a: dict[str, jax.Array], b: dict[str, jax.Array]
) -> tuple[list[LeafComparison], list[str]]:
  """`(rows, not compared)` for NNX state Linen has none of (RNG state, or
  state only the port has) in two training states.

  It is compared only between two NNX states holding it at the same paths
  and shapes (the same layout); otherwise every such leaf is listed as not
  compared, for the report to say so.
  """
  same = set(a) == set(b) and all(a[p].shape == b[p].shape for p in a)
  if not (a and b and same):
    return [], sorted(set(a) | set(b))
  rows = []
  for path in sorted(a):
    equal, diff = leaf_difference(a[path], b[path])
    rows.append(LeafComparison(
        linen_path='-', nnx_path=path, shape=tuple(a[path].shape), dtype=str(a[path].dtype),
        spec_a=_spec(a[path]), spec_b=_spec(b[path]), max_abs_diff=diff,
        identical=equal and _same_placement(a[path], b[path]),
    ))
  return rows, []


def as_json(rows: list[LeafComparison]) -> list[dict[str, Any]]:
  return [
      dataclasses.asdict(r) | {
          'shape': list(r.shape),
          'max_abs_diff': None if np.isnan(r.max_abs_diff) else r.max_abs_diff,
      }
      for r in rows
  ]


def compare_checkpoints(
    a: str, b: str, *, models=None, allow_unfinished: bool = False,
) -> tuple[list[LeafComparison], tuple[str, str], dict]:
  """Rows comparing the training states of two checkpoints, in A's layout.

  `models` (a `ModelPair`) is what `convert_checkpoint` takes.
  `allow_unfinished` reads Orbax saves that never finished (see
  `checkpoints.inspect`).

  Raises:
    CheckpointError: a checkpoint cannot be read, or does not hold the
      models' training state.
    VerificationError: A and B hold different models or optimizers.
  """
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint import training_states, weights
  from converters.checkpoint.models import check_model_pair
  from converters.errors import VerificationError

  models = check_model_pair(models)
  infos = checkpoints.inspect(a, allow_unfinished), checkpoints.inspect(b, allow_unfinished)
  described = [models.summary(i) for i in infos]
  without_layout = [{k: v for k, v in d.items() if k != 'layout'} for d in described]
  if without_layout[0] != without_layout[1]:
    raise VerificationError(
        f'A and B hold different models: {without_layout[0]} != {without_layout[1]}'
    )
  # Both sides as Linen TrainStates (or Linen variables) in A's layout.
  plan_a = models.plan(infos[0], 'linen')
  plan_b = models.plan(infos[1], 'linen', plan_a.source.layout)
  infos = tuple(
      dataclasses.replace(i, framework=p.source.framework) if i.weights else i
      for i, p in zip(infos, (plan_a, plan_b))
  )
  _check_same_kind(infos, (plan_a, plan_b))
  model = () if infos[0].weights else ('model',)
  states, rngs, own = [], [], []
  with jax.set_mesh(plan_a.mesh):
    for info, plan in zip(infos, (plan_a, plan_b)):
      checkpoints.check_structure(
          info, checkpoints.leaves_of(plan.source.abstract_state), plan.source.what
      )
      checkpoints.check_tree(info, plan.source.abstract_state)
    for info, plan in zip(infos, (plan_a, plan_b)):
      state = checkpoints.restore(info, plan.source.abstract_state)
      if plan.source.weights:  # in its standard form: Linen's boxed variables, NNX Variables
        state = weights.standard(plan.source, state)
        plan = dataclasses.replace(plan, source=weights.standardized(plan.source))
      rngs.append(rng_leaves(state) if info.framework == 'nnx' else {})
      own.append(nnx_only_leaves(state, plan.paths, model) if info.framework == 'nnx' else {})
      if info.framework != 'linen' or plan.source.layout != plan.target.layout:
        state = training_states.convert(state, plan)
        side = plan.target
      else:
        side = plan.source
      states.append(weights.standard(side, state) if side.weights else state)
    if infos[0].weights:
      _check_same_kind(infos, (plan_a, plan_b), states)
    rows = compare_linen_states(*states, plan_a.paths, plan_a.correspondence, model)
    rng_rows, not_compared = compare_nnx_state(*rngs)
    own_rows, own_not_compared = compare_nnx_state(*own)
    rows += rng_rows + own_rows
  if infos[0].framework != infos[1].framework:
    labels = tuple(_FRAMEWORK_NAMES[i.framework] for i in infos)
  else:
    labels = ('A', 'B')
  summaries = [
      {**i.summary(), 'layout': p.source.layout, **d}
      for i, p, d in zip(infos, (plan_a, plan_b), described)
  ]
  return rows, labels, {
      'a': summaries[0], 'b': summaries[1], 'rng_not_compared': not_compared,
      'nnx_only_not_compared': own_not_compared,
  }


def _check_same_kind(infos, plans, states=None) -> None:
  """Refuses to compare a training state with weights, or weights of other
  contents (every collection against the parameters alone: `states`, both
  as Linen variables, differ in their collections)."""
  from converters.checkpoint import weights
  from converters.errors import VerificationError

  forms = [weights.describe(p.source) if i.weights else 'a training state' for i, p in zip(infos, plans)]
  kinds = {i.weights for i in infos}
  if len(kinds) > 1 or (states is not None and set(states[0]) != set(states[1])):
    raise VerificationError(
        f'A and B hold different things: A {forms[0]}, B {forms[1]}'
        + ('' if states is None else f' (as Linen: {sorted(states[0])} and {sorted(states[1])})')
        + "; compare checkpoints of the same content, or convert one to the other's form first"
    )


def compare_outputs(
    a: str, b: str, *, models=None, allow_unfinished: bool = False,
) -> tuple[list[LeafComparison], tuple[str, str], dict]:
  """Rows comparing what the models the two checkpoints restore into
  compute: a check that shares nothing with the path mapping (which serves
  only to find each checkpoint's layout), unlike `compare_checkpoints`.

  Each checkpoint is restored with its own framework's model (Linen's
  module applied with its variables and the `LinenModel`'s keyword
  arguments, e.g. `train=False`; NNX's model after `.eval()`). Both run
  where a wrong conversion shows, not only at the example:

  - on the Linen model's example inputs, on them made generic (floats
    scaled element by element, integer arrays drawn anew: constant tokens
    make a query and a key alike) and with their selectors drawn anew
    (booleans both ways, integer scalars), as inference's witness runs
    them (`generic_inputs`, `selector_inputs`);
  - backward: the gradient of a fixed random projection of the outputs
    with respect to each floating input (a custom derivative is seen),
    where both programs can be differentiated;
  - in training: Flax's Linen layers in training as `.train()` puts NNX's,
    the n-th random key of the call the same on both sides
    (`converters.training_mode`): dropout on the wrong weight is seen.
    Not where either model scans (a scan draws its layers' keys at its
    trace, and Linen's traces its body twice) or cannot run in training
    alone (a batch norm over a mapped axis): the rows say what ran.

  Inputs are placed replicated on the mesh the models run on. Everything
  compares bit for bit: a model and its port in one layout compile to one
  program.

  Raises:
    CheckpointError: the models are not given, a checkpoint does not hold
      their training state, or a model fails to run (its error, in one line).
  """
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint.models import UserModels

  if not isinstance(models, UserModels):
    raise CheckpointError(
        'comparing outputs runs your two models: give models=UserModels(linen_model, '
        'nnx_model, ...) (--linen-model and --nnx-model)'
    )
  infos = checkpoints.inspect(a, allow_unfinished), checkpoints.inspect(b, allow_unfinished)
  mesh = models.make_mesh()
  with jax.set_mesh(mesh), nn.logical_axis_rules(models.rules or ()):
    sides = [models.source_layout(info, mesh) for info in infos]
    example = models.linen_model(models.layouts('linen')[0])  # its inputs serve both
    input_sets, base_set = _input_sets((example.args, example.keyword_inputs), mesh)
    runners = [_runner(path, info, layout, side, models) for path, info, (layout, side) in zip((a, b), infos, sides)]
    layouts = [side.layout for _, side in sides]
    results = [_running(path, which, _runs, runner, held, input_sets, base_set)
               for path, which, runner, held in runners]
    _add_training_runs(results, runners, *input_sets[base_set])
  rows = _output_rows(*results)
  labels = tuple(_FRAMEWORK_NAMES[s.framework] for _, s in sides)
  if labels[0] == labels[1]:
    labels = ('A', 'B')
  summaries = [{**i.summary(), 'layout': l} for i, l in zip(infos, layouts)]
  return rows, labels, {'a': summaries[0], 'b': summaries[1], 'outputs': True}


def _runner(path: str, info, layout, side, models) -> tuple:
  """`(path, framework's name, runs, variables or model)` of one restored checkpoint."""
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint import weights
  from converters.linen_trees import input_collections

  state = checkpoints.restore(info, side.abstract_state)
  which = _FRAMEWORK_NAMES[side.framework]
  if side.framework == 'linen':
    linen = models.linen_model(layout)
    state = weights.runnable(side, state) if side.weights else state
    return path, which, _LinenRuns(linen.module, linen.settings), input_collections(
        state, CollectionTable(models.collections))
  held = weights.runnable(side, state) if side.weights else side.objects(state)[0]
  return path, which, _NNXRuns(), held


def _add_training_runs(results: list[dict], runners: list[tuple], base_name: str, base: tuple) -> None:
  """Each side's training-mode output on the base inputs, where both sides can draw alike.

  Not under a scan, which draws its layers' keys at its trace (Linen's
  `nn.scan` traces its body twice), nor where a model does not run in
  training on its own (a batch norm reducing over a mapped axis).
  """
  if any(_running(path, which, runner.scans, runner.prepared(held, training=False), base)
         for path, which, runner, held in runners):
    return
  trained = []
  for _, _, runner, held in runners:
    try:
      trained.append(runner.jit(runner.training)(runner.prepared(held, training=True), *base))
    except Exception:  # noqa: BLE001 - no training run: what else it compares stands
      return
  for found, out in zip(results, trained):
    found[f'training-mode output{{}} on {base_name}'] = out


def _output_rows(first: dict, second: dict) -> list[LeafComparison]:
  """A row per output leaf of each run both sides made (a run one side could
  not make, a program it cannot differentiate, is left out on both)."""
  rows = []
  for what in [w for w in first if w in second]:
    x_tree, y_tree = first[what], second[what]
    if jax.tree.structure(x_tree) != jax.tree.structure(y_tree):
      raise CheckpointError(
          f'the two models return {what} of different structures: '
          f'{jax.tree.structure(x_tree)} and {jax.tree.structure(y_tree)}'
      )
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(x_tree), jax.tree.leaves(y_tree)):
      name = what.format(jax.tree_util.keystr(path))
      identical, difference = leaf_difference(x, y)  # (False, nan) for other shapes or dtypes
      dtype = str(x.dtype) if x.dtype == y.dtype else f'{x.dtype} / {y.dtype}'
      rows.append(LeafComparison(name, name, tuple(x.shape), dtype, _spec(x), _spec(y), difference, identical))
  return rows


def _input_sets(args, mesh) -> tuple[list[tuple[str, tuple]], int]:
  """`([(what, inputs)], base)`: the example inputs `args` (a tuple of the
  call's arguments, here `(positional, keyword)`; abstract ones drawn as
  inference's witness draws them), made generic, and with their selectors
  drawn anew, each placed replicated on `mesh`; `base` the index of the set
  the gradients and training run on: the inputs made generic, else the
  example's (selector draws may leave a model's range)."""
  from converters.inference.evaluation import outside_any_mesh
  from converters.inference.witness import (
    SELECTOR_DRAWS,
    example_inputs,
    generic_inputs,
    selector_inputs,
  )

  leaves, tree = jax.tree.flatten(args)
  arrays = [k for k, x in enumerate(leaves) if isinstance(x, jax.ShapeDtypeStruct) or hasattr(x, 'shape')]
  with outside_any_mesh():
    given = example_inputs([leaves[k] for k in arrays], [leaves[k] for k in arrays])
    drawn = [('the example inputs', given)]
    generic = generic_inputs(given)
    if generic is not None:
      drawn.append(('the inputs made generic', generic))
    drawn += [(f'inputs with their selectors drawn anew ({d + 1})', selector_inputs(given, d))
              for d in range(SELECTOR_DRAWS)]
  replicated = NamedSharding(mesh, PartitionSpec())
  sets = []
  for what, values in drawn:
    placed = list(leaves)
    for k, value in zip(arrays, values):
      placed[k] = jax.device_put(value, replicated)
    sets.append((what, tuple(jax.tree.unflatten(tree, placed))))
  return sets, 1 if generic is not None else 0


class _LinenRuns:
  """A Linen module's calls in eval mode and in training, as `_runs` makes
  them: on `(args, kwargs)`, the inputs of both models, with the Linen
  call's own `settings` (`train=False`)."""

  jit = staticmethod(jax.jit)

  def __init__(self, module: nn.Module, settings):
    self.module, self.settings = module, dict(settings)

  def eval(self, variables, args, kwargs):
    with linen_draws_in_order():  # a stream the model draws itself, as inference draws it
      return self.module.apply(variables, *args, **kwargs, **self.settings)

  def training(self, variables, args, kwargs):
    with nn.intercept_methods(linen_in_training), linen_draws_in_order():
      return self.module.apply(variables, *args, **kwargs, **self.settings, mutable=True)[0]

  def gradients(self, inputs_of):
    """`(variables, chosen) ->` the gradient of `_projection` of the outputs
    with respect to `chosen`, the inputs being `inputs_of(chosen)`."""
    def run(variables, chosen):
      return jax.grad(lambda c: _projection(self.eval(variables, *inputs_of(c))))(chosen)
    return run

  def scans(self, variables, xs) -> bool:
    return runs_a_scan(jax.make_jaxpr(lambda v: self.eval(v, *xs))(variables))

  def prepared(self, variables, training: bool):
    return variables


class _NNXRuns:
  """An NNX model's calls in eval mode and in training, as `_runs` makes them."""

  jit = staticmethod(nnx.jit)

  @staticmethod
  def eval(model, args, kwargs):
    with nnx_draws_in_order():
      return model(*args, **kwargs)

  @staticmethod
  def training(model, args, kwargs):
    with nnx_draws_in_order():
      return model(*args, **kwargs)

  @staticmethod
  def gradients(inputs_of):
    """As `_LinenRuns.gradients`, by `nnx.grad`: the model an argument it
    traces, so that the port's own transforms (`nnx.remat`) run inside."""
    def run(model, chosen):
      return nnx.grad(lambda m, c: _projection(_NNXRuns.eval(m, *inputs_of(c))), argnums=1)(model, chosen)
    return run

  @staticmethod
  def scans(model, xs) -> bool:
    graphdef, state = nnx.split(model)
    return runs_a_scan(jax.make_jaxpr(lambda s: _NNXRuns.eval(nnx.merge(graphdef, s), *xs))(state))

  @staticmethod
  def prepared(model, training: bool):
    copy = nnx.merge(*nnx.split(model))  # a mode (and what training writes) of its own
    if training:
      copy.train()
    else:
      copy.eval()
    return copy


def _running(path, which: str, run, *args):
  """`run(*args)`, an error of the user's model a `CheckpointError` naming
  the checkpoint, in one line."""
  try:
    return run(*args)
  except CheckpointError:
    raise
  except Exception as e:  # noqa: BLE001 - the user's model: any error of theirs
    text = str(e).strip().splitlines()
    raise CheckpointError(
        f'{path}: running the {which} model restored from it failed: '
        f'{type(e).__name__}: {text[0] if text else ""}'
    ) from e


def _runs(side, held, input_sets, base: int) -> dict[str, Any]:
  """`{what: results}` of one side in eval mode: outputs on each input
  set, and the gradients of a fixed projection of them with respect to the
  floating inputs on `input_sets[base]` (left out where the program
  cannot be differentiated: a `while_loop`, integer outputs). `what` holds
  `{}` where a leaf's path goes."""
  found = {}
  model = side.prepared(held, training=False)
  run = side.jit(side.eval)
  for what, xs in input_sets:
    found[f'output{{}} on {what}'] = run(model, *xs)
  what, xs = input_sets[base]
  leaves, tree = jax.tree.flatten(xs)
  floats = [k for k, x in enumerate(leaves) if hasattr(x, 'dtype') and jnp.issubdtype(x.dtype, jnp.floating)]
  if floats:
    try:
      inputs_of = lambda chosen: _with(leaves, floats, chosen, tree)
      grads = side.jit(side.gradients(inputs_of))(model, [leaves[k] for k in floats])
    except Exception:  # noqa: BLE001 - JAX's refusal to differentiate the program: no run backward
      return found
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(xs)[0]]
    found[f'the gradient of input {{}} on {what}'] = {paths[k]: g for k, g in zip(floats, grads)}
  return found


def _projection(outputs) -> jax.Array:
  """A fixed random projection of the floating outputs (the same on both sides)."""
  return sum(
      jnp.sum(out.astype(jnp.float32) * jax.random.normal(jax.random.key(k), out.shape))
      for k, out in enumerate(jax.tree.leaves(outputs)) if jnp.issubdtype(out.dtype, jnp.floating)
  )


def _with(leaves, floats, chosen, tree):
  given = list(leaves)
  for k, v in zip(floats, chosen):
    given[k] = v
  return jax.tree.unflatten(tree, given)
