"""Tracing both models' forward passes into jaxprs whose inputs are named.

`trace_linen` and `trace_nnx` run `jax.make_jaxpr` over abstract variables
(`ShapeDtypeStruct`s: no FLOPs, no parameter memory) and return a `Trace`:
the jaxpr, what each of its inputs is (a variable with its collection and
path, an example input, or other state such as NNX's RNG keys), and what
each of its outputs is (an output of the model, or the new value of a
variable the call writes: a decode cache, batch statistics). Either is traced
in eval mode as given, or in training (`training=True`: Flax's Linen layers
in training as `model.train()` puts the port's, both sides drawing the
n-th key of the call alike: `converters.training_mode`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.errors
import jax
import numpy as np
from flax import linen as nn
from flax import nnx
from jax.extend import core as jcore

from converters import compat
from converters.errors import ConversionError, PathMappingError
from converters.linen_model import is_array, nothing_sown, split_arrays
from converters.metadata import is_linen_box
from converters.paths import format_path
from converters.training_mode import linen_draws_in_order, linen_in_training, nnx_draws_in_order
from converters.variable_types import CollectionTable


@dataclasses.dataclass(frozen=True)
class Call:
  """The arguments of one side's forward pass.

  `args` and `kwargs` are the inputs both models take: their arrays (or
  `ShapeDtypeStruct`s) are the trace's inputs, in `inputs` order, drawn and
  varied by the witness; anything else in them (a flag, a count) and
  `settings` (this side's own keywords: Linen's `train=False`) are
  constants of the trace.
  """

  args: tuple = ()
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def inputs(self) -> list:
    return split_arrays(self.args, self.kwargs)[1]

  def arguments(self, inputs) -> tuple[tuple, dict]:
    """`(args, kwargs)` of the call with `inputs` in place of the arrays."""
    args, kwargs = split_arrays(self.args, self.kwargs)[0](*inputs)
    return args, {**kwargs, **self.settings}

  def fixed(self) -> list[str]:
    """The keywords that are not arrays (inputs of both calls, or this
    side's settings): constants of the trace, which no draw varies."""
    inputs = [k for k, v in self.kwargs.items() if not all(map(is_array, jax.tree.leaves(v)))]
    return sorted({*inputs, *self.settings})


@dataclasses.dataclass(frozen=True)
class Trace:
  """One model's forward pass as a jaxpr with named inputs and outputs.

  Attributes:
    closed: the jaxpr; its inputs are the variables, then the example inputs.
    variables: `(collection, path)` of each input that is a variable, None
      for other state (RNG keys, an array attribute: constants of the call).
    inputs: how many inputs are the example inputs' leaves (the last ones).
    outputs: how many outputs are the model's (the first ones); each later
      output is the new value of the input of the same index in `variables`.
    constants: `{input index: value}` of the port's own constants: array
      attributes (a convolution's mask) and Variables of no Linen collection
      (a positional table) that the call does not write; None where the
      model is abstract.
    own: `{input index: path}` of those constants: state only the port has.
  """

  closed: jcore.ClosedJaxpr
  variables: tuple[tuple[str, tuple] | None, ...]
  inputs: int
  outputs: int
  constants: Mapping[int, Any] = dataclasses.field(default_factory=dict)
  own: Mapping[int, tuple] = dataclasses.field(default_factory=dict)

  @property
  def updated(self) -> list[tuple[int, int]]:
    """`(output, input)` of every variable the call writes, by index."""
    jaxpr = self.closed.jaxpr
    found = []
    for k, var in enumerate(jaxpr.outvars[self.outputs:]):
      if not (isinstance(var, jcore.Var) and var is jaxpr.invars[k]):
        found.append((self.outputs + k, k))
    return found


def _abstract(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, 'shape') else x


def _key_name(key) -> str:
  """A path key's name: a dict's key, or a sequence's index (a value sown
  into a collection is a tuple of them)."""
  return str(key.key) if hasattr(key, 'key') else str(getattr(key, 'idx', key))


def _named_leaves(tree) -> list[tuple[tuple, Any]]:
  return [
      ((_key_name(k[0]), tuple(_key_name(x) for x in k[1:])), v)
      for k, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_linen_box)[0]
  ]


def trace_linen(module: nn.Module, call: Call, rngs=None, training: bool = False) -> Trace:
  """`module.apply(variables, *args, **kwargs)` of `call` over abstract
  variables (`training`: Flax's layers in training, draws in call order).

  A call that writes a collection (a decode cache, batch statistics in
  training) is traced with `mutable=True`, its new values as outputs."""
  with nn.intercept_methods(linen_in_training) if training else contextlib.nullcontext():
    return _trace_linen(module, call, rngs, training)


def _trace_linen(module: nn.Module, call: Call, rngs, training: bool) -> Trace:
  # Every stream but `params` draws the n-th key of the call alike on both
  # sides (`training_mode`), in eval mode too: a model drawing noise of its
  # own (`self.make_rng('noise')`) has its stream, and the port the same keys.
  # Keys counted from each trace of the call (not from `init`'s).
  draws = linen_draws_in_order
  rngs = rngs if rngs is not None else {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  inputs = call.inputs

  def init(r, a):
    args, kwargs = call.arguments(a)
    return module.init(r, *args, **kwargs)

  # The model's state, not what it sows (an auxiliary loss); its shapes
  # alone are read, so initial values are zeros, not drawn.
  with draws(), nothing_sown(), compat.initializer_draws_as_zeros():
    variables = jax.eval_shape(init, rngs, inputs)
  bare = jax.tree.map(lambda b: _abstract(b.value if is_linen_box(b) else b), variables, is_leaf=is_linen_box)
  named = _named_leaves(bare)
  names = [name for name, _ in named]

  def apply(v, a):
    args, kwargs = call.arguments(a)
    return module.apply(v, *args, **kwargs), [x for _, x in _named_leaves(v)]

  def apply_mutable(v, a):
    args, kwargs = call.arguments(a)
    out, new = module.apply(v, *args, **kwargs, mutable=True)
    written = {name: (x.value if is_linen_box(x) else x) for name, x in _named_leaves(new)}
    return out, [written.get(name, x) for name, x in _named_leaves(v)]

  try:
    with draws():
      closed, shape = jax.make_jaxpr(apply, return_shape=True)(bare, inputs)
  except flax.errors.ModifyScopeVariableError:
    # traced anew, so no operation of the failed trace remains
    with draws():
      closed, shape = jax.make_jaxpr(apply_mutable, return_shape=True)(bare, inputs)
  return _trace(closed, names, shape)


def trace_nnx(model: nnx.Module, call: Call, table: CollectionTable, training: bool = False) -> Trace:
  """`model(*args, **kwargs)` of `call` over its abstract state; state the call writes
  (a decode cache, batch statistics) is an output. `training`: a copy of
  `model` after `.train()`, drawing in call order."""
  if training:
    model = nnx.merge(*nnx.split(model))
    model.train()
  graphdef, state = nnx.split(model)
  flat = list(nnx.to_flat_state(state))
  names, constants, own = [], {}, {}
  for path, variable in flat:
    if not isinstance(variable, nnx.Variable) or table.has_none(variable):
      # An array attribute (a convolution's mask) or a Variable of no Linen
      # collection (a positional table): a constant of the port's own.
      names.append(None)
      value = variable.get_raw_value() if isinstance(variable, nnx.Variable) else variable
      if not jax.dtypes.issubdtype(getattr(value, 'dtype', None), jax.dtypes.prng_key):
        # its value, or None in an abstract model (nothing to run it with)
        concrete = isinstance(value, (jax.Array, np.ndarray))
        constants[len(names) - 1] = value if concrete else None
        own[len(names) - 1] = tuple(path)
      continue
    collection = table.collection(variable, format_path(path), tuple(path))
    names.append(None if collection is None else (collection, tuple(path)))
  abstract = jax.tree.map(_abstract, state)

  def forward(s, a):
    module = nnx.merge(graphdef, s)
    args, kwargs = call.arguments(a)
    with nnx_draws_in_order():  # as Linen's (`_trace_linen`)
      out = module(*args, **kwargs)
    after = dict(nnx.to_flat_state(nnx.state(module)))
    return out, [_value(after.get(path, v)) for path, v in nnx.to_flat_state(s)]

  closed, shape = jax.make_jaxpr(forward, return_shape=True)(abstract, call.inputs)
  trace = dataclasses.replace(_trace(closed, names, shape), constants=constants, own=own)
  for _, k in trace.updated:
    if k in own and isinstance(flat[k][1], nnx.Variable):
      # written by the call: state, not a constant; refused as such
      table.collection(flat[k][1], format_path(own[k]), own[k])
  return trace


def _value(x):
  return x.get_value() if isinstance(x, nnx.Variable) else x


def _trace(closed: jcore.ClosedJaxpr, names: list, shape) -> Trace:
  n_in = len(closed.jaxpr.invars) - len(names)
  n_out = len(jax.tree.leaves(shape[0]))
  return Trace(closed, tuple(names), n_in, n_out)


def traced(which: str, trace: Callable[..., Trace], *args, fix: str) -> Trace:
  """`trace(*args)`, any error of the user's model raised as `PathMappingError`
  (`fix`: how to give the call's arguments, in the caller's own terms)."""
  try:
    return trace(*args)
  except ConversionError:
    raise
  except Exception as e:  # the user's model: any error of theirs
    text = str(e).strip().splitlines()
    raise PathMappingError(
        f'the {which} model: tracing its forward pass on the example inputs failed: '
        f'{type(e).__name__}: {text[0] if text else ""}',
        fix=fix,
    ) from e
