"""One call that checks a whole port: conversion both ways, outputs, gradients, training.

`assert_port_equivalent(linen_module, linen_variables, nnx_model, *inputs)`:
  - every collection converts Linen -> NNX -> Linen and NNX -> Linen -> NNX
    to exactly what it was (values bit for bit, annotations, shardings);
  - the NNX model holding the converted variables computes the Linen outputs
    (in eval mode: `nnx_model.eval()` against `linen_kwargs`, e.g.
    `{'train': False}`), with the same shardings, and writes the same new
    values into every collection the call writes (a decode step's `cache`),
    and with `linen_train_kwargs`, in train mode too (dropout drawn alike
    on both sides: outputs and batch statistics after one step);
  - the same gradients of `loss(outputs)` with respect to the parameters;
  - and the same settings of the layers that act only in training (Flax's
    `Dropout` rates, attention dropout rates and `BatchNorm` momentum, as
    sets of values).
`assert_training_equivalent(linen_state, linen_step, nnx_target, nnx_step,
batches, k=...)`: k Linen steps, conversion, the remaining steps in NNX equal
all the steps taken in Linen (parameters, collections, optimizer state, step).

Comparisons are exact by default. Pass `atol` only under a stated condition
(e.g. the two sides compile to different programs) and say why where you call.
Run them inside the mesh and rules contexts your models use. Neither your
models nor your variables are modified.
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.core import scope as linen_scope

from converters.api import linen_to_nnx, nnx_to_linen
from converters.comparison import describe_difference, differs
from converters.errors import PathMappingError
from converters.inference import infer_linen_model, infer_paths
from converters.linen_model import LinenModel, split_arrays
from converters.metadata import is_linen_box
from converters.paths import Infer, PathMapping, as_infer
from converters.testing.tables import format_table
from converters.training_mode import linen_draws_in_order, nnx_draws_in_order, patched, runs_a_scan


def mean_square_loss(outputs) -> jax.Array:
  """Mean of squares over every floating output leaf (the checks' loss
  unless given one)."""
  leaves = [x for x in jax.tree.leaves(outputs) if jnp.issubdtype(x.dtype, jnp.floating)]
  return sum(jnp.mean(jnp.square(x.astype(jnp.float32))) for x in leaves)


def _leaves(tree) -> dict[str, Any]:
  """`{path: leaf}` with Linen boxes and NNX Variables kept whole."""
  is_leaf = lambda x: is_linen_box(x) or isinstance(x, nnx.Variable)
  return {
      jax.tree_util.keystr(p): x
      for p, x in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]
  }


def _describe(leaf) -> tuple[Any, Any]:
  """`(array, what annotates it)` of a box, a Variable or a bare array."""
  if isinstance(leaf, nnx.Variable):
    meta = {k: v for k, v in leaf.get_metadata().items() if k not in ('hijax', 'ref')}
    return leaf.get_value(), (type(leaf).__name__, tuple(sorted(meta.items(), key=lambda kv: kv[0])))
  if is_linen_box(leaf):
    fields = {k: v for k, v in vars(leaf).items() if k != 'value'}
    return leaf.unbox(), (type(leaf).__name__, tuple(sorted(fields.items())))
  return leaf, None


def _diff(a, b, atol: float) -> str | None:
  """What differs between two arrays, or None."""
  # A Python number (a TrainState's step before any jit) is weakly typed, as in JAX.
  dtype = lambda x: x.dtype if hasattr(x, 'dtype') else np.result_type(x)  # keys: no np.dtype
  if isinstance(a, (int, float)) and not isinstance(a, bool):
    a = np.asarray(a, dtype=dtype(b))
  if isinstance(b, (int, float)) and not isinstance(b, bool):
    b = np.asarray(b, dtype=dtype(a))
  a_shape, b_shape = np.shape(a), np.shape(b)
  a_dtype, b_dtype = dtype(a), dtype(b)
  if a_shape != b_shape or a_dtype != b_dtype:
    return f'{a_shape} {a_dtype} vs {b_shape} {b_dtype}'
  sharding_a, sharding_b = getattr(a, 'sharding', None), getattr(b, 'sharding', None)
  if (
      sharding_a is not None and sharding_b is not None
      and not sharding_a.is_equivalent_to(sharding_b, len(a_shape))
  ):
    return f'sharding {getattr(sharding_a, "spec", sharding_a)} vs {getattr(sharding_b, "spec", sharding_b)}'
  return describe_difference(a, b) if differs(a, b, atol) else None


def _compare_trees(what: str, expected, actual, atol: float = 0.0, annotations: bool = True) -> list[list[str]]:
  """Rows `[what, path, problem]` where two trees differ (structure, values, annotations)."""
  a, b = _leaves(expected), _leaves(actual)
  rows = [[what, p, 'missing'] for p in sorted(set(a) - set(b))]
  rows += [[what, p, 'unexpected'] for p in sorted(set(b) - set(a))]
  for path in sorted(set(a) & set(b)):
    (x, note_x), (y, note_y) = _describe(a[path]), _describe(b[path])
    if annotations and note_x != note_y:
      rows.append([what, path, f'annotation {note_x} vs {note_y}'])
    problem = _diff(x, y, atol)
    if problem:
      rows.append([what, path, problem])
  return rows


def _fail(title: str, rows: list[list[str]]) -> None:
  if rows:
    raise AssertionError(f'{title}\n' + format_table(['check', 'leaf', 'differs in'], rows))


def _bare(tree):
  return jax.tree.map(lambda x: x.unbox() if is_linen_box(x) else x, tree, is_leaf=is_linen_box)


def assert_port_equivalent(
    linen_module: nn.Module, linen_variables: Mapping, nnx_model: nnx.Module, *inputs: Any,
    paths: PathMapping | str | None = None, rules: tuple | None = None,
    collections: Mapping[str, type] | None = None,
    linen_kwargs: Mapping[str, Any] | None = None, nnx_kwargs: Mapping[str, Any] | None = None,
    linen_train_kwargs: Mapping[str, Any] | None = None, linen_train_module: nn.Module | None = None,
    loss: Callable[[Any], jax.Array] | None = None, atol: float = 0.0, axis_name: str | None = None,
    drawn_streams: Sequence[str] | None = None, **keyword_inputs: Any,
) -> None:
  """The NNX port `nnx_model` is the Linen `linen_module`: see the module docstring.

  Args:
    linen_module: the original.
    linen_variables: its variables (every collection: `params`,
      `batch_stats`, `cache`, ...).
    nnx_model: the port (real, any values; used as the conversion target and
      never modified).
    inputs: example inputs, passed to both calls.
    keyword_inputs: example inputs passed to both calls by name
      (`inputs=tokens`, as Flax's examples call their models): arrays,
      traced and varied like positional ones; a keyword of one side only
      goes in `linen_kwargs` or `nnx_kwargs`.
    paths: as in `converters.linen_to_nnx`; `paths='infer'` derives the
      mapping from what the two models compute (`converters.infer_paths`).
    rules: as in `converters.linen_to_nnx`.
    collections: as in `converters.linen_to_nnx`.
    linen_kwargs: extra keyword arguments of the Linen call in eval mode
      (e.g. `{'train': False}`).
    nnx_kwargs: extra keyword arguments of the NNX call in eval mode.
    linen_train_kwargs: the Linen call's keyword arguments in train mode
      (e.g. `{'train': True}`): then one training step is compared too,
      Linen's against the port's after `.train()`, dropout included, both
      sides drawing the n-th key of the call alike whatever stream it comes
      from (`converters.training_mode`): the outputs and the new values of
      what the step writes (batch statistics). A port that draws in another
      order than the original fails here.
    linen_train_module: the original in train mode where its fields, not its
      call, set the mode (Flax's sst2 `TextClassifier(deterministic=False)`,
      whose port's `deterministic` is what `.train()` sets): a training step
      is compared too, this module's call (with `linen_train_kwargs`, else
      `linen_kwargs`) against the port's after `.train()`. It holds the
      same variables as `linen_module`.
    loss: scalar function of the outputs whose gradients are compared
      (default: the mean of squares of every floating output).
    atol: tolerance for outputs and gradients; 0 compares bits.
    axis_name: the mapped axis the layers reduce over, as under `pmap`
      (`BatchNorm(axis_name='batch')` in training, a `LayerNorm`'s always):
      every call then runs on both sides as the one replica of it
      (`on_one_replica`).
    drawn_streams: the RNG streams the model draws from itself (Linen's
      `self.make_rng('noise')`, the port's `self.rngs.noise()` from the
      `nnx.Rngs` it keeps): both sides draw the same keys, in the order
      they draw them (`linen_draws`, `nnx_draws`), so that what is drawn is
      compared too. Default: every stream but `params` the Linen call
      draws in eval mode (`streams_drawn`).
  """
  _refuse_abstract(inputs, keyword_inputs)
  linen_kwargs, nnx_kwargs = dict(linen_kwargs or {}), dict(nnx_kwargs or {})
  if (infer := as_infer(paths)) is not None:
    paths = infer_paths(
        linen_module, _eval_probe(nnx_model), *inputs, linen_kwargs=linen_kwargs, nnx_kwargs=nnx_kwargs,
        linen_train_kwargs=linen_train_kwargs, paths=infer.known, collections=collections, **keyword_inputs,
    )
  options = dict(paths=paths, rules=rules, collections=collections)
  model, gradient_model = _converted_in_eval_mode(linen_variables, nnx_model, options)
  rows = _eval_mode_rows(
      linen_module, linen_variables, nnx_model, model, gradient_model, (tuple(inputs), dict(keyword_inputs)),
      linen_kwargs=linen_kwargs, nnx_kwargs=nnx_kwargs, options=options, loss=loss or mean_square_loss,
      atol=atol, axis_name=axis_name, drawn_streams=drawn_streams,
  )
  trained = [] if linen_train_kwargs is None and linen_train_module is None else _training_step(
      linen_module if linen_train_module is None else linen_train_module, linen_variables, gradient_model,
      (tuple(inputs), dict(keyword_inputs)),
      linen_kwargs=linen_kwargs if linen_train_kwargs is None else linen_train_kwargs,
      nnx_kwargs=nnx_kwargs, options=options, atol=atol, axis_name=axis_name,
  )
  _fail(f'Linen and NNX disagree in eval mode, or in settings only training uses (atol={atol}).',
        rows + trained if rows else [])
  if trained:
    _fail(f'Linen and NNX agree in eval mode but not in a training step (atol={atol}), {_DRAW_AS_LINEN}', trained)


#: What a port that agrees in eval mode but not in a training step does otherwise.
_DRAW_AS_LINEN = (
    'where dropout and every other random draw act, both sides drawing the n-th key of the call '
    'alike: a port that draws its keys in another order or number (one key split in two '
    'where Linen draws two, a draw of its own before Linen\'s) differs here though it may '
    'compute the same; draw as Linen does, one key per make_rng in its order (the port\'s '
    '`rngs.<stream>()`), or the rest of the port differs in training.'
)


def _converted_in_eval_mode(linen_variables, nnx_model: nnx.Module, options: dict) -> tuple[nnx.Module, nnx.Module]:
  """The port with Linen's variables (round trips checked), in eval mode, twice:
  one for the call, which may write state, and one for the gradients."""
  model = _assert_round_trips(linen_variables, nnx_model, options)
  model.eval()
  return model, nnx.clone(model)


def _refuse_abstract(inputs: tuple, keyword_inputs: dict) -> None:
  """`assert_port_equivalent` runs both models: its inputs are arrays, not shapes."""
  abstract = [x for x in jax.tree.leaves((inputs, keyword_inputs)) if isinstance(x, jax.ShapeDtypeStruct)]
  if abstract:
    raise TypeError(
        f'assert_port_equivalent runs both models: give arrays as inputs, not {len(abstract)} '
        f'jax.ShapeDtypeStruct ({abstract[0].shape} {abstract[0].dtype}); shapes alone serve '
        'infer_paths and LinenModel, which draw them'
    )


def _eval_mode_rows(linen_module, linen_variables, nnx_model, model, gradient_model, inputs, *, linen_kwargs,
                    nnx_kwargs, options, loss, atol, axis_name, drawn_streams) -> list:
  """The rows of every eval-mode check of `assert_port_equivalent` that differs:
  outputs and what the call writes, gradients, and the settings only training uses."""
  args, keyword_inputs = inputs
  # Every collection but the parameters may be written by the call (a decode
  # step's cache): Linen's new values are compared with the port's after its call.
  streams = (tuple(drawn_streams) if drawn_streams is not None
             else streams_drawn(linen_module, linen_variables, args, {**keyword_inputs, **linen_kwargs}))
  linen_apply = _linen_call(linen_module, linen_variables, linen_kwargs, streams=streams)
  call = lambda m, *xs, **kw: nnx_call(m, *xs, drawn_streams=streams, **kw, **nnx_kwargs)
  rows = _compare_call(
      ('outputs', 'variables the call writes'), linen_apply, linen_variables, model, inputs,
      call=call, options=options, atol=atol, axis_name=axis_name,
  )
  rows += _compare_gradients(
      linen_apply, linen_variables, gradient_model, inputs, call=call, loss=loss, options=options, atol=atol,
      axis_name=axis_name,
  )
  return rows + _training_settings(linen_module, linen_variables, inputs, linen_kwargs, nnx_model, streams)

def _training_paths(paths, linen_model, nnx_model: nnx.Module, collections):
  """`assert_training_equivalent`'s mapping: `paths`, or inferred from `linen_model` and the port."""
  infer = as_infer(paths)
  if infer is None:
    if linen_model is not None:
      raise PathMappingError(
          f"linen_model given with paths={paths!r}: it is read only to infer the mapping; "
          "pass paths='infer', or leave it out"
      )
    return paths
  if not isinstance(linen_model, LinenModel):
    raise PathMappingError(
        "paths='infer' runs both models on example inputs: pass "
        'linen_model=LinenModel(module, *example_inputs) (converters.LinenModel), '
        f'got {type(linen_model).__name__}'
    )
  return infer_linen_model(linen_model, _eval_probe(nnx_model), paths=infer.known, collections=collections)


def _eval_probe(nnx_model: nnx.Module) -> nnx.Module:
  """The port with the same arrays, in eval mode, for inference to run (the port is not modified)."""
  probe = nnx.merge(*nnx.split(nnx_model))
  probe.eval()
  return probe


def _assert_round_trips(linen_variables, nnx_model: nnx.Module, options: dict) -> nnx.Module:
  """Linen -> NNX -> Linen and NNX -> Linen -> NNX give back every leaf;
  the port holding the Linen variables."""
  if not jax.tree.leaves(linen_variables):  # a configuration that makes none (`norms=False`)
    held = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(nnx.state(nnx_model, nnx.Param))]
    if held:
      raise AssertionError(f'Linen makes no variable, but the port holds parameters: {", ".join(held[:5])}')
    return nnx_model
  model = linen_to_nnx(linen_variables, target=nnx_model, **options)
  back = nnx_to_linen(model, target=linen_variables, **options)
  rows = _compare_trees('Linen -> NNX -> Linen', dict(linen_variables), back)
  own = nnx_to_linen(nnx_model, **options)
  again = linen_to_nnx(own, target=nnx_model, **options)
  rows += _compare_trees(
      'NNX -> Linen -> NNX', nnx.state(nnx_model, nnx.Not(nnx.RngState)),
      nnx.state(again, nnx.Not(nnx.RngState)),
  )
  _fail('The conversion is not the identity both ways.', rows)
  return model


def _compare_gradients(
    linen_apply, linen_variables, gradient_model, inputs, *, call, loss, options, atol,
    axis_name: str | None = None,
) -> list[list[str]]:
  """Rows where the gradients of `loss` differ between the two sides (as
  one replica of `axis_name` where given)."""
  # Both sides take every variable and input array as an argument: one
  # closed over would be a constant that XLA folds (rsqrt of batch
  # statistics, say) or fuses with other rounding than the runtime's.
  rebuild, arrays = split_arrays(*inputs)
  if 'params' not in linen_variables:
    return []  # no parameters (a counter of batch statistics): no gradients

  def linen_grads(variables, *xs):
    args, kwargs = rebuild(*xs)

    def linen_loss(params):
      return loss(linen_apply({**variables, 'params': params}, *args, **kwargs)[0])
    return jax.grad(linen_loss)(variables['params'])

  graphdef, state = nnx.split(gradient_model)

  def nnx_grads(state, *xs):
    args, kwargs = rebuild(*xs)
    return nnx.grad(lambda model: loss(call(model, *args, **kwargs)))(nnx.merge(graphdef, state))

  mapped = (lambda f: f) if axis_name is None else (lambda f: on_one_replica(f, axis_name))
  expected_grads = jax.jit(mapped(linen_grads))(linen_variables, *arrays)
  actual_grads = jax.jit(mapped(nnx_grads))(state, *arrays)
  # Gradients are compared bare and by path: where each side's compiler puts
  # them is not a property of the port.
  # On the host: a transform of a rule then relays arrays of no annotation,
  # which the conversion refuses for arrays placed sharded.
  converted = linen_to_nnx(
      {'params': jax.device_get(_bare(expected_grads))}, paths=options['paths'],
      collections=options['collections'],
  )
  expected = {k: np.asarray(v) for k, v in _leaves(nnx.to_pure_dict(converted)).items()}
  actual = {k: np.asarray(v) for k, v in _leaves(nnx.to_pure_dict(actual_grads)).items()}
  return _compare_trees('gradients', expected, actual, atol, annotations=False)


def _linen_call(linen_module, linen_variables, kwargs, interceptor=None, streams: Sequence[str] = ()) -> Callable:
  """`(variables, *inputs, **keyword_inputs) -> (outputs, new values of
  every collection but the parameters)` of the Linen module with its own
  `kwargs` (`train=False`), under `interceptor` if given, its draws from
  `streams` as `linen_draws` makes them."""
  written = [c for c in linen_variables if c != 'params']

  def call(variables, *xs, **keyword_inputs):
    with contextlib.ExitStack() as stack:
      if interceptor:
        stack.enter_context(nn.intercept_methods(interceptor))
      if streams:
        stack.enter_context(linen_draws(streams))
      if not written:
        return linen_module.apply(variables, *xs, **keyword_inputs, **kwargs), {}
      return linen_module.apply(variables, *xs, mutable=written, **keyword_inputs, **kwargs)

  return call


def nnx_call(model: nnx.Module, *xs, drawn_streams: Sequence[str] = (), **kwargs):
  """`model(*xs, **kwargs)` as the checks call a port: what it sows captured
  and left out (values sown during a call are outputs of it, not state;
  Linen keeps them only when asked, `mutable=['intermediates']`, as the
  Linen calls here do not), its draws from `drawn_streams` as `nnx_draws`
  makes them."""
  with nnx_draws(model, drawn_streams) if drawn_streams else contextlib.nullcontext():
    outputs, _ = nnx.capture(model, nnx.Intermediate)(*xs, **kwargs)
  return outputs


def streams_drawn(linen_module: nn.Module, linen_variables, args: Sequence, kwargs: Mapping) -> tuple[str, ...]:
  """The RNG streams but `params` that `linen_module.apply(variables, *args,
  **kwargs)` draws from (`self.make_rng`, Flax's layers'), found by tracing
  the call once."""
  seen: set[str] = set()
  rebuild, arrays = split_arrays(tuple(args), dict(kwargs))

  def call(variables, *xs):
    xs_args, xs_kwargs = rebuild(*xs)
    return linen_module.apply(variables, *xs_args, **xs_kwargs, mutable=True)  # a cache it writes too

  with streams_recorded(seen):
    jax.eval_shape(call, linen_variables, *arrays)
  return tuple(sorted(seen))


@contextlib.contextmanager
def streams_recorded(seen: set[str]) -> Iterator[None]:
  """Within the context, Linen's `make_rng` of any stream but `params` adds
  the stream to `seen` and returns one fixed key (for a trace)."""
  original = linen_scope.Scope.make_rng

  def make_rng(scope, name: str = 'params'):
    if name == 'params':
      return original(scope, name)
    seen.add(name)
    return jax.random.key(0)

  with patched(linen_scope.Scope, 'make_rng', make_rng):
    yield


def _stream_key(stream: str) -> jax.Array:
  """The key both sides of a check draw `stream` from."""
  return jax.random.fold_in(jax.random.key(0), zlib.crc32(stream.encode()) & 0x7FFFFFFF)


def _in_draw_order(streams: Sequence[str]) -> Callable[[str], jax.Array]:
  """`next_key(stream)`: `fold_in(k, n)` for the n-th draw of `stream` (one
  of `streams`, `k` its `_stream_key`), as both sides of a check draw."""
  counts = dict.fromkeys(streams, 0)

  def next_key(stream: str) -> jax.Array:
    key = jax.random.fold_in(_stream_key(stream), counts[stream])
    counts[stream] += 1
    return key

  return next_key


@contextlib.contextmanager
def linen_draws(streams: Sequence[str]) -> Iterator[None]:
  """Linen's `make_rng(stream)`, for each of `streams`, draws
  `fold_in(k, n)` for its n-th draw from the start of the context (`k` a
  key per stream), as `nnx_draws` makes the port draw: the same keys on
  both sides for a port that draws in the same order. (Linen's own keys
  depend on the module's path, which NNX does not have.) Not for keys
  split under a lifted transform: those are drawn once, at its trace."""
  original = linen_scope.Scope.make_rng
  next_key = _in_draw_order(streams)

  def make_rng(scope, name: str = 'params'):
    return original(scope, name) if name not in streams else next_key(name)

  with patched(linen_scope.Scope, 'make_rng', make_rng):
    yield


@contextlib.contextmanager
def nnx_draws(model: nnx.Module, streams: Sequence[str]) -> Iterator[None]:
  """Every `RngStream` of `streams` that `model` holds (its `Rngs`', and the
  ones `nnx.Dropout` forks for itself) draws `fold_in(k, n)` for the n-th
  draw of its stream from the start of the context, as `linen_draws` makes
  Linen draw: the same keys on both sides for a port that draws in the same
  order. A stream the model does not hold (one made during the call, with a
  seed of its own) draws its own keys: a port ignoring the model's keys is
  not given Linen's. The streams' own state is left as it is."""
  held = {id(node) for _, node in nnx.iter_graph(model) if isinstance(node, nnx.RngStream)}
  original = nnx.RngStream.__call__
  next_key = _in_draw_order(streams)

  def draw(stream):
    return original(stream) if stream.tag not in streams or id(stream) not in held else next_key(stream.tag)

  with patched(nnx.RngStream, '__call__', draw):
    yield


def on_one_replica(f: Callable, axis_name: str) -> Callable:
  """`f(held, *inputs)` run as the one replica of a mapped axis named
  `axis_name`: what the layers reduce over it (`BatchNorm`'s statistics
  averaged over replicas, as under `pmap`) is the replica's own. `held` (the
  variables, the model's state) is shared; the inputs and the results get
  an axis of one and lose it again. Both sides of a comparison run so: the
  mapping is the same program on each."""
  def run(held, *inputs):
    mapped = jax.vmap(f, in_axes=(None,) + (0,) * len(inputs), axis_name=axis_name)
    results = mapped(held, *jax.tree.map(lambda x: jnp.asarray(x)[None], inputs))
    return jax.tree.map(lambda x: x[0], results)

  return run


def _compare_call(labels, linen_call, linen_variables, model, inputs, *, call, options, atol,
                  axis_name: str | None = None) -> list:
  """Rows comparing one call of each side: the outputs (`labels[0]`) and the
  new values of what the call writes (`labels[1]`), the port's read after
  its call of `model` (which it updates); as one replica of `axis_name`
  where given. `inputs`: `(args, kwargs)` of both calls; what is not an
  array in them (a count) stays a Python value."""
  rebuild, arrays = split_arrays(*inputs)
  graphdef, state = nnx.split(model)

  def linen_side(variables, *xs):
    args, kwargs = rebuild(*xs)
    return linen_call(variables, *args, **kwargs)

  def nnx_side(state, *xs):
    held = nnx.merge(graphdef, state)
    args, kwargs = rebuild(*xs)
    return call(held, *args, **kwargs), nnx.state(held)

  mapped = (lambda f: f) if axis_name is None else (lambda f: on_one_replica(f, axis_name))
  linen_out, linen_new = jax.jit(mapped(linen_side))(linen_variables, *arrays)
  nnx_out, after = jax.jit(mapped(nnx_side))(state, *arrays)
  if jax.tree.structure(linen_out) != jax.tree.structure(nnx_out):
    raise AssertionError(
        f'output structures differ: Linen {jax.tree.structure(linen_out)}, NNX {jax.tree.structure(nnx_out)}'
    )
  rows = _compare_trees(labels[0], linen_out, nnx_out, atol)
  if rows:
    # The port's program returns its whole state (its streams' counts
    # carried through a scan, say), Linen's only what it writes: XLA places
    # their buffers otherwise, and its CPU dot can round by placement (1 to
    # 2 ulp seen, jax 0.10.2). The outputs again, from programs returning
    # them alone on both sides, from the state before the call (`state`
    # holds the model's own variables: updated below, not yet).
    outputs_alone = lambda side: jax.jit(mapped(lambda *a: side(*a)[0]))
    rows = _compare_trees(labels[0], outputs_alone(linen_side)(linen_variables, *arrays),
                          outputs_alone(nnx_side)(state, *arrays), atol)
  nnx.update(model, after)
  if linen_new:
    nnx_new = nnx_to_linen(model, **options)
    rows += _compare_trees(labels[1], dict(linen_new), {c: nnx_new.get(c, {}) for c in linen_new}, atol)
  return rows


def without_linen_dropout(next_fun, args, kwargs, context):
  """An interceptor (`nn.intercept_methods`) leaving Linen's dropout out:
  `nn.Dropout` returns its input, attention runs deterministic. Dropout's
  random streams differ by framework, so training steps are compared
  without it."""
  if isinstance(context.module, nn.Dropout) and context.method_name == '__call__':
    return args[0]
  module = context.module
  if isinstance(module, nn.MultiHeadDotProductAttention) and context.method_name == '__call__':
    # Its attention dropout, off; Linen takes `deterministic` either built
    # in or at the call, never both.
    if module.deterministic is None:
      return next_fun(*args, **{**kwargs, 'deterministic': True})
    built = module.deterministic
    object.__setattr__(module, 'deterministic', True)
    try:
      return next_fun(*args, **kwargs)
    finally:
      object.__setattr__(module, 'deterministic', built)
  return next_fun(*args, **kwargs)


class DropoutActing:
  """The rates of Flax's dropout layers (`Dropout`, multi-head attention's)
  that act during a traced call of each side, in training: a layer told
  `deterministic=True` at its call, or built so, does not. Compared as
  sets of `(kind, rate)`: a port may call one `Dropout` where Linen has
  several."""

  def __init__(self):
    self.seen: dict[str, set[tuple[str, float]]] = {'Linen': set(), 'NNX': set()}

  def _record(self, side: str, kind: str, rate: float, call_flag, built_flag) -> None:
    deterministic = built_flag if call_flag is None else call_flag
    if rate > 0 and isinstance(deterministic, (bool, np.bool_)) and not deterministic:
      self.seen[side].add((kind, float(rate)))

  def linen(self, next_fun, args, kwargs, context):
    """An interceptor recording Linen's layers."""
    module = context.module
    if context.method_name == '__call__' and isinstance(module, nn.Dropout):
      flag = kwargs.get('deterministic', args[1] if len(args) > 1 else None)
      self._record('Linen', 'Dropout', module.rate, flag, module.deterministic)
    elif context.method_name == '__call__' and isinstance(module, nn.MultiHeadDotProductAttention):
      self._record('Linen', 'attention', module.dropout_rate, kwargs.get('deterministic'), module.deterministic)
    return next_fun(*args, **kwargs)

  @contextlib.contextmanager
  def nnx(self) -> Iterator[None]:
    """Within the context, NNX's layers are recorded at their calls."""
    dropout, attention = nnx.Dropout.__call__, nnx.MultiHeadAttention.__call__

    def dropout_call(module, *args, **kwargs):
      self._record('NNX', 'Dropout', module.rate, kwargs.get('deterministic'), module.deterministic)
      return dropout(module, *args, **kwargs)

    def attention_call(module, *args, **kwargs):
      self._record('NNX', 'attention', module.dropout_rate, kwargs.get('deterministic'), module.deterministic)
      return attention(module, *args, **kwargs)

    with patched(nnx.Dropout, '__call__', dropout_call), patched(nnx.MultiHeadAttention, '__call__', attention_call):
      yield

  def rows(self) -> list:
    """A row for each kind whose acting rates differ."""
    rows = []
    for kind in ('Dropout', 'attention'):
      theirs, ours = ({r for k, r in self.seen[side] if k == kind} for side in ('Linen', 'NNX'))
      if theirs != ours:
        show = lambda rates: ', '.join(map(str, sorted(rates))) or 'none'
        rows.append(['train-mode outputs', f'{kind} acting in training',
                     f'Linen at rates {show(theirs)}; NNX at {show(ours)} (a layer told deterministic=True '
                     'at its call, or built so, does not act: give the port the original\'s modes)'])
    return rows


def without_nnx_dropout(model: nnx.Module) -> None:
  """`model`'s dropout left out, in place, as `without_linen_dropout`
  leaves Linen's out, whatever `deterministic=` their calls are given:
  its `Dropout` layers at rate 0, its attention layers drawing no key and
  computing their weights deterministically at their own rate (at rate 0
  NNX's attention takes another kernel, `jax.nn.dot_product_attention`,
  than Linen's deterministic one)."""
  for _, module in nnx.iter_modules(model):
    if isinstance(module, nnx.Dropout):
      module.rate = 0.0
    elif isinstance(module, nnx.MultiHeadAttention) and module.dropout_rate > 0.0:
      module.attention_fn = functools.partial(
          _deterministic_attention, module.attention_fn, module.dropout_rate)
      module.dropout_rate = 0.0  # no key drawn, whatever the call's `deterministic`


def _deterministic_attention(attention_fn, rate, *args, **kwargs):
  """`attention_fn` without dropout, at `rate` (the kernel it picks)."""
  return attention_fn(*args, **{**kwargs, 'dropout_rate': rate, 'deterministic': True,
                                'dropout_rng': None})


def _training_step(linen_module, linen_variables, model, inputs, *, linen_kwargs, nnx_kwargs,
                   options, atol, axis_name=None) -> list:
  """Rows for one train-mode call of each side, dropout and every other
  draw included, the n-th key of the call the same on both sides
  (`converters.training_mode`): outputs and the new values of every
  collection but the parameters. Where dropout acts, with which
  `broadcast_dims` and how many times is compared by its effect. Where
  either side runs a scan, whose draws cannot align, Flax's dropout is
  left out on both sides (`without_linen_dropout`, `without_nnx_dropout`)
  and the rest of the step compared, the model's own draws still in order."""
  model = nnx.clone(model)
  model.train()
  linen_call = _linen_call(linen_module, linen_variables, linen_kwargs)

  def linen_in_order(variables, *xs, **kw):
    with linen_draws_in_order():
      return linen_call(variables, *xs, **kw)

  def nnx_in_order(held, *xs, **kw):
    with nnx_draws_in_order():
      return nnx_call(held, *xs, **kw, **nnx_kwargs)

  rebuild, arrays = split_arrays(*inputs)
  graphdef, state = nnx.split(model)
  mapped = (lambda f: f) if axis_name is None else (lambda f: on_one_replica(f, axis_name))
  on = lambda side: lambda held, *xs: side(held, *rebuild(*xs)[0], **rebuild(*xs)[1])
  acting = DropoutActing()
  with nn.intercept_methods(acting.linen), acting.nnx():
    traced = [
        jax.make_jaxpr(mapped(on(linen_in_order)))(linen_variables, *arrays),
        jax.make_jaxpr(mapped(lambda s, *xs: on(nnx_in_order)(nnx.merge(graphdef, s), *xs)))(state, *arrays),
    ]
  if any(runs_a_scan(t) for t in traced):
    # Flax's dropout layers left out; the model's own draws (a word dropout
    # of its own) still drawn in order on both sides. Which of them act in
    # training, compared apart: the step no longer shows it.
    if acting.rows():
      return acting.rows()
    without_nnx_dropout(model)
    linen_call = _linen_call(linen_module, linen_variables, linen_kwargs, without_linen_dropout)
  return _compare_call(
      ('train-mode outputs', 'what a training step writes'), linen_in_order,
      linen_variables, model, inputs, call=nnx_in_order, options=options, atol=atol,
      axis_name=axis_name,
  )


def _training_settings(linen_module, linen_variables, inputs, linen_kwargs, nnx_model, streams=()) -> list:
  """Rows for the settings of layers that act only in training and so leave
  eval-mode outputs alike: dropout rates and batch-norm momentum, compared
  as the set of values of each kind of layer (a port may call one module
  where Linen has several; Flax's `Dropout`, `BatchNorm` and multi-head
  attention on both sides, a hand-written equivalent is not seen: a port
  with no `nnx.MultiHeadAttention` is not asked for attention rates)."""
  linen: dict[tuple, tuple] = {}

  def record(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, nn.Dropout):
      linen[('Dropout', module.path)] = (module.rate,)
    elif isinstance(module, nn.MultiHeadDotProductAttention):
      linen[('attention', module.path)] = (module.dropout_rate,)
    elif isinstance(module, nn.BatchNorm):
      linen[('BatchNorm', module.path)] = (module.momentum, module.axis_name)
    return next_fun(*args, **kwargs)

  rebuild, arrays = split_arrays(*inputs)
  linen_call = _linen_call(linen_module, linen_variables, linen_kwargs, record, streams)
  jax.eval_shape(lambda variables, *xs: linen_call(variables, *rebuild(*xs)[0], **rebuild(*xs)[1]),
                 linen_variables, *arrays)
  ported: dict[str, list] = {'Dropout': [], 'BatchNorm': [], 'attention': []}
  for _, module in nnx.iter_modules(nnx_model):
    if isinstance(module, nnx.Dropout):
      ported['Dropout'].append((module.rate,))
    elif isinstance(module, nnx.MultiHeadAttention):
      ported['attention'].append((module.dropout_rate,))
    elif isinstance(module, nnx.BatchNorm):
      ported['BatchNorm'].append((module.momentum, module.axis_name))
  rows = []
  # A BatchNorm's axis name changes nothing on one device, and what it
  # averages over on several (under pmap): compared as a setting.
  for kind, names in (('Dropout', 'rate'), ('BatchNorm', 'momentum, axis_name'), ('attention', 'dropout_rate')):
    if kind == 'attention' and not ported[kind]:
      continue  # the port's own attention (fused projections): its rates are not seen
    # Sets, not counts: a port may call one Dropout module where Linen has several.
    theirs = sorted({v for (k, _), v in linen.items() if k == kind})
    ours = sorted(set(ported[kind]))
    if theirs != ours:
      show = lambda values: ', '.join(
          str(v[0]) if len(v) == 1 else '(' + ', '.join(map(repr, v)) + ')' for v in values) or 'none'
      rows.append([
          'training settings', f'{kind} {names}',
          f"Linen {show(theirs)}; NNX {show(ours)} (give the port the original's settings)",
      ])
  return rows


def assert_training_equivalent(
    linen_state,
    linen_step: Callable,
    nnx_target: tuple[nnx.Module, nnx.Optimizer],
    nnx_step: Callable,
    batches: Sequence[Any],
    *,
    k: int,
    paths: PathMapping | Infer | str | None = None,
    rules: tuple | None = None,
    collections: Mapping[str, type] | None = None,
    linen_model: LinenModel | None = None,
    atol: float = 0.0,
    start: tuple[nnx.Module, nnx.Optimizer] | None = None,
) -> None:
  """k Linen steps, then conversion, then the other steps in NNX, equal every step in Linen.

  Args:
    linen_state: a `TrainState` (a subclass with `batch_stats` and the like
      converts them too).
    linen_step: `(state, batch) -> state` or `-> (state, ...)`.
    nnx_target: `(model, optimizer)` of the port, the conversion's target.
    nnx_step: `(model, optimizer, batch) -> anything`, updating in place.
    batches: one batch per step; `k` of them are taken in Linen first.
    paths: as in `converters.linen_to_nnx`; `paths='infer'` (or
      `Infer(known_rules)`) derives the mapping from what the two models
      compute (`converters.infer_paths`, in eval mode), from `linen_model`.
    rules: as in `converters.linen_to_nnx`.
    collections: as in `converters.linen_to_nnx`.
    linen_model: with `paths='infer'`, `LinenModel(module, *example_inputs,
      **kwargs)`: the Linen module and the inputs of one forward pass in eval
      mode (e.g. `train=False`); the port is `nnx_target`'s model.
    atol: tolerance on every compared leaf; 0 compares bits.
    start: the port's `(model, optimizer)` after the k Linen steps as your
      conversion made it (restored from the checkpoint `linen-nnx convert`
      wrote): first checked equal to Linen's state after k steps converted
      here, then trained on (it is updated in place).
  """
  if not 0 <= k <= len(batches):
    raise ValueError(f'k={k}: take between 0 and len(batches)={len(batches)} steps in Linen')
  paths = _training_paths(paths, linen_model, nnx_target[0], collections)
  options = dict(paths=paths, rules=rules, collections=collections)

  def step(state, batch):
    out = linen_step(state, batch)
    return out[0] if isinstance(out, tuple) else out

  reference = linen_state
  for batch in batches:
    reference = step(reference, batch)
  state = linen_state
  for batch in batches[:k]:
    state = step(state, batch)
  model, optimizer = linen_to_nnx(state, target=nnx_target, **options)
  if start is not None:
    rows = _compare_trees(
        'the given start', nnx.state((model, optimizer), nnx.Not(nnx.RngState)),
        nnx.state(start, nnx.Not(nnx.RngState)), atol,
    )
    _fail(f'The given start is not Linen\'s state after {k} steps converted.', rows)
    model, optimizer = start
  for batch in batches[k:]:
    nnx_step(model, optimizer, batch)
  back = nnx_to_linen((model, optimizer), target=reference, **options)
  rows = _compare_trees(f'{k} Linen + {len(batches) - k} NNX steps', reference, back, atol)
  _fail(
      f'{k} Linen steps, conversion and {len(batches) - k} NNX steps differ from '
      f'{len(batches)} Linen steps (atol={atol}).',
      rows,
  )
