"""The proof a port is handed over with: the written file imported, built at
the Linen model's configuration, given the Linen variables through the
`PATHS` written beside it, and checked with `converters.testing.assert_port_equivalent` (eval
outputs and gradients bit for bit, and a training step where the model has
modes), as the test file written beside it repeats in the user's CI.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import enum
import functools
import importlib.util
import inspect
import itertools
import os
import re
import sys
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.core import FrozenDict

from converters.api import linen_to_nnx, nnx_to_linen
from converters.comparison import LeafRelative
from converters.linen_model import LinenModel, nothing_sown, split_arrays
from converters.port import layers, shapes, switches, tracing
from converters.testing import assert_port_equivalent
from converters.testing.port import linen_draws, nnx_call, streams_recorded


def import_file(path: str) -> types.ModuleType:
  """The Python file at `path` imported as a module of its own name."""
  name = '_linen_nnx_port_' + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def paths_file(out: str) -> str:
  """The file the mapping of the port written to `out` goes to: beside it,
  `models_nnx_paths.py` for `models_nnx.py`."""
  stem, _ = os.path.splitext(out)
  return f'{stem}_paths.py'


def port_paths(generated: types.ModuleType):
  """The mapping written beside the port module `generated`: `PATHS` of
  its `paths_file` (`models_nnx_paths.py` beside `models_nnx.py`)."""
  return import_file(paths_file(generated.__file__)).PATHS


def _vocabulary(linen_model: LinenModel) -> int:
  """The fewest rows of the model's embeddings (1 if it has none): integer
  inputs drawn below it index every table."""
  root, _ = tracing.trace(linen_model.module, *linen_model.args, **linen_model.kwargs)
  sizes = [c.module.num_embeddings for c in root.walk() if isinstance(c.module, nn.Embed)]
  return min(sizes, default=1)


def example_inputs(linen_model: LinenModel) -> tuple[tuple, dict]:
  """The factory's inputs made concrete: shapes become arrays (floats drawn
  from a normal distribution, integers drawn below the smallest embedding's
  size, so that a proof is not made on token 0 alone); arrays are kept, but
  integer arrays of zeros (placeholders) are drawn as shapes are."""
  # NumPy draws them: JAX would compile a program for each draw and check.
  generator = np.random.default_rng(0)
  vocabulary = None

  def concrete(x):
    nonlocal vocabulary
    if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
      return x
    placeholder = isinstance(x, jax.ShapeDtypeStruct) or (
        jnp.issubdtype(x.dtype, jnp.integer) and not np.any(np.asarray(x))
    )
    if not placeholder:
      return x
    if jnp.issubdtype(x.dtype, jnp.floating):
      return jnp.asarray(generator.standard_normal(x.shape, dtype=np.float32).astype(x.dtype))
    if jnp.issubdtype(x.dtype, jnp.integer):
      vocabulary = vocabulary or _vocabulary(linen_model)
      return jnp.asarray(generator.integers(0, vocabulary, x.shape).astype(x.dtype))
    return jnp.asarray(np.zeros(x.shape, x.dtype))

  return jax.tree.map(concrete, (linen_model.args, dict(linen_model.kwargs)))


def nnx_arguments(nnx_class: type, linen_model: LinenModel) -> dict[str, Any]:
  """The generated constructor's arguments for the Linen model's
  configuration: its fields by name, the input sizes it asks for."""
  module = linen_model.module
  signature = inspect.signature(nnx_class.__init__)
  arguments: dict[str, Any] = {}
  for name, parameter in signature.parameters.items():
    if name in ('self', 'rngs'):
      continue
    if hasattr(module, name) and name not in ('parent', 'scope'):
      arguments[name] = nnx_value(getattr(module, name), sys.modules[nnx_class.__module__])
    elif name == 'in_features':
      arrays = [a for a in linen_model.args if hasattr(a, 'shape')]
      arguments[name] = arrays[0].shape[-1]
    elif name.endswith('_shape_with_batch'):
      arguments[name] = _input_named(linen_model, name.removesuffix('_shape_with_batch')).shape
    elif name.endswith('_shape'):  # one example's: the batch left out
      arguments[name] = _input_named(linen_model, name.removesuffix('_shape')).shape[1:]
    elif parameter.default is inspect.Parameter.empty:
      raise TypeError(f'{nnx_class.__name__}({name}=...) is neither a field of the Linen model nor an input size')
  return arguments


def nnx_value(value, generated: types.ModuleType):
  """A field's value as the port takes it: a Linen module class the model
  is configured with (`conv=nn.Conv`, `block_cls=ResNetBlock`) as its NNX
  counterpart (Flax's layer, or the generated class of the same name), a
  partial of one as the same partial of that, its fields NNX names
  otherwise renamed; anything else as it is. A partial fixing a mode
  (`use_running_average=True`) is refused: NNX sets modes for every layer."""
  if isinstance(value, functools.partial):
    cls = value.func
    while isinstance(cls, functools.partial):
      cls = cls.func
    spec = layers.layer_spec(cls)
    keywords = {k: nnx_value(v, generated) for k, v in value.keywords.items()}
    if spec is not None:
      fixed = [k for k in keywords if k in dict(spec.mode)]
      if fixed:
        raise TypeError(f'the model is configured with a partial of {cls.__name__} fixing {fixed[0]}='
                        f'{keywords[fixed[0]]!r}, a mode NNX sets for every layer (model.train() / .eval())')
      keywords = {spec.nnx_argument(k): v for k, v in keywords.items()}
    args = [nnx_value(a, generated) for a in value.args]
    return functools.partial(nnx_value(value.func, generated), *args, **keywords)
  if isinstance(value, type) and issubclass(value, nn.Module):
    spec = layers.layer_spec(value)
    if spec is not None and spec.subclass is None:
      return spec.nnx_class
    ported = getattr(generated, value.__name__, None)
    if not isinstance(ported, type) or not issubclass(ported, nnx.Module):
      raise TypeError(f'the model is configured with the Linen class {value.__name__}, which the port '
                      'has no class of the same name for')
    return ported
  if isinstance(value, enum.Enum):
    # The port's file defines the enum again: its members are the port's.
    ported = getattr(generated, type(value).__name__, None)
    if isinstance(ported, type) and issubclass(ported, enum.Enum) and value.name in ported.__members__:
      return ported[value.name]
    return value
  if _is_dataclass_instance(value):
    # A configuration object: the port's class of that name where it has
    # one, its fields as the port takes them.
    fields = {f.name: nnx_value(getattr(value, f.name), generated) for f in dataclasses.fields(value) if f.init}
    ported = getattr(generated, type(value).__name__, None)
    if isinstance(ported, type) and dataclasses.is_dataclass(ported) and ported is not type(value):
      return ported(**fields)
    changed = {k: v for k, v in fields.items() if v is not getattr(value, k)}
    return dataclasses.replace(value, **changed) if changed else value
  return value


def batch_axis_name(linen_model: LinenModel) -> str | None:
  """The mapped axis the model's layers reduce over (`BatchNorm(axis_name=
  'batch')` in training, as Flax's ResNet trains under `pmap`): the checks
  run as its one replica. None if there is none; several are refused."""
  root, _ = tracing.trace(linen_model.module, *linen_model.args, **linen_model.kwargs)
  names = {c.module.axis_name for c in root.walk() if isinstance(getattr(c.module, 'axis_name', None), str)}
  if len(names) > 1:
    raise AssertionError(f'the layers reduce over the mapped axes {sorted(names)}; the proof binds one '
                         '(prove the port by hand, under your own pmap or shard_map)')
  return names.pop() if names else None


def _input_named(linen_model: LinenModel, name: str):
  call = type(linen_model.module).__call__
  names = list(inspect.signature(call).parameters)[1:]
  if name in names and names.index(name) < len(linen_model.args):
    return linen_model.args[names.index(name)]
  if name in linen_model.kwargs:
    return linen_model.kwargs[name]
  raise TypeError(f'the example inputs have no {name!r}')


def drawn_streams(linen_model: LinenModel) -> tuple[str, ...]:
  """The RNG streams the Linen model draws from itself (`make_rng`, Flax's
  `Dropout`'s too) when it initialises on its inputs as given and with each
  flag of its call turned round (a `train=True` draws what `train=False`
  does not): `params` left out."""
  seen: set[str] = set()
  kwargs = dict(linen_model.kwargs)
  flips = [kwargs] + [{**kwargs, k: not v} for k, v in kwargs.items() if isinstance(v, bool)]
  with streams_recorded(seen):
    for given in flips:
      rebuild, arrays = split_arrays(linen_model.args, given)

      def init(*arrays, rebuild=rebuild):
        args, keywords = rebuild(*arrays)
        return linen_model.module.init(jax.random.key(0), *args, **keywords)

      try:
        with nothing_sown():
          jax.eval_shape(init, *(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in arrays))
      except Exception:  # noqa: BLE001 - a flag Linen refuses turned round: nothing drawn there
        continue
  return tuple(sorted(seen))


def _rngs(streams: Sequence[str], seed: int) -> nnx.Rngs:
  """The port's `Rngs`: `seed` for its parameters, and for each stream the
  model draws from (`drawn_streams`: the port's `self.rngs.<stream>()`)."""
  return nnx.Rngs(seed, **dict.fromkeys(streams, seed))


def build(nnx_class: type, linen_model: LinenModel, seed: int = 0) -> nnx.Module:
  """The port at the Linen model's configuration."""
  return nnx_class(**nnx_arguments(nnx_class, linen_model), rngs=_rngs(drawn_streams(linen_model), seed))


def holding(nnx_class: type, linen_model: LinenModel, variables, paths, *, seed: int = 0,
            cache_shape: tuple | None = None, streams: Sequence[str] | None = None) -> nnx.Module:
  """The port at the Linen model's configuration holding the Linen
  `variables`, converted through `paths`; with `cache_shape`
  (`(input_shape, dtype)`), its `init_cache` run first to make the cache
  variables Linen's `cache` converts into. Built abstractly
  (`nnx.eval_shape`): the converted values replace whatever its
  initialisers would make, and compiling those is a proof's dearest step."""
  arguments = nnx_arguments(nnx_class, linen_model)
  streams = drawn_streams(linen_model) if streams is None else streams

  def make():
    model = nnx_class(**arguments, rngs=_rngs(streams, seed))
    if cache_shape is not None:
      model.init_cache(*cache_shape)
    return model

  if not jax.tree.leaves(variables):  # a configuration that makes none (`norms=False`): nothing to convert
    return make()
  return linen_to_nnx(variables, target=nnx.eval_shape(make), paths=paths, rngs=seed)


def mode_fields(linen_model: LinenModel, modes: Mapping[str, bool]) -> dict[str, bool]:
  """The modes that are fields of the model (not flags of its call), with
  their value in training."""
  names = list(inspect.signature(type(linen_model.module).__call__).parameters)[1:]
  fields = shapes.module_fields(linen_model.module)
  return {k: v for k, v in modes.items() if k not in names and k.split('.')[0] in fields}


def fields_the_mode_sets(nnx_class: type, linen_model: LinenModel) -> dict[str, bool]:
  """The bool fields of the Linen model (not left None) that its port keeps
  as what `.train()` and `.eval()` set (sst2's `deterministic`, merged with
  its call's flag), with their value in training: set on the Linen side,
  they are the port's mode, not a configuration. Read off the port built
  abstractly, turned to each mode."""
  fields = [f for f in shapes.module_fields(linen_model.module) if isinstance(getattr(linen_model.module, f), bool)]
  if not fields:
    return {}
  try:
    model = nnx.eval_shape(lambda: nnx_class(**nnx_arguments(nnx_class, linen_model), rngs=nnx.Rngs(0)))
  except Exception:  # noqa: BLE001 - not built so: the proof's own build reports why
    return {}
  model.train()
  trained = {f: getattr(model, f, None) for f in fields}
  model.eval()
  return {f: v for f, v in trained.items() if isinstance(v, bool) and getattr(model, f, None) is (not v)}


def with_values(module: nn.Module, values: Mapping[str, Any]) -> nn.Module:
  """`module` with the fields (`'deterministic'`) and flags inside them
  (`'config.deterministic'`) set to `values`."""
  changes: dict[str, Any] = {}
  for path, value in values.items():
    field, *rest = path.split('.')
    changes[field] = shapes.replaced_at(changes.get(field, getattr(module, field)), tuple(rest), value)
  return module.clone(parent=None, **changes)


def call_keywords(linen_model: LinenModel, modes: Mapping[str, bool]) -> tuple[tuple, dict, dict, dict | None]:
  """`(inputs, linen eval kwargs, nnx kwargs, linen train kwargs)`: the
  mode flags (`train`) given to Linen only, at their eval and train values
  (modes that are fields of the model are not the call's: left out)."""
  args, kwargs = example_inputs(linen_model)
  names = list(inspect.signature(type(linen_model.module).__call__).parameters)[1:]
  modes = {k: v for k, v in modes.items() if k not in mode_fields(linen_model, modes)}
  args = list(args)
  for flag in modes:
    if flag in names and names.index(flag) < len(args):
      kwargs[flag] = args.pop(names.index(flag))
  nnx_kwargs = {k: v for k, v in kwargs.items() if k not in modes}
  eval_kwargs = {**nnx_kwargs, **{flag: not train for flag, train in modes.items()}}
  train_kwargs = {**nnx_kwargs, **{flag: train for flag, train in modes.items()}} if modes else None
  return tuple(args), eval_kwargs, nnx_kwargs, train_kwargs


def linen_variables(linen_model: LinenModel, inputs: tuple, kwargs: Mapping,
                    streams: Sequence[str] | None = None) -> dict:
  """The Linen model's variables for `inputs`, made by `init` in one
  compiled program (arrays traced; flags such as `train=False` stay Python
  values, as the code branches on them)."""
  rebuild, arrays = split_arrays(inputs, kwargs)

  def init(rngs, *arrays):
    args, keywords = rebuild(*arrays)
    return linen_model.module.init(rngs, *args, **keywords)

  rngs = {'params': jax.random.key(1), 'dropout': jax.random.key(2)}
  streams = drawn_streams(linen_model) if streams is None else streams
  with linen_draws(streams), nothing_sown():  # its draws as the checks draw them; no sown values
    return jax.jit(init)(rngs, *arrays)


def assert_generated_port(
    linen_model: LinenModel, generated: types.ModuleType, *, modes: Mapping[str, bool] | None = None,
    paths=None, as_written: bool = True,
) -> float:
  """The generated module's class for `linen_model` is its port: built at
  the same configuration and given the Linen variables through the `PATHS`
  written beside it (`port_paths`), it computes the same outputs, gradients
  and training step.

  `modes`: the Linen call's flags the port turned into its mode, with their
  value in training (`{'train': True}`); the test file written with the port
  passes them. `paths`: the mapping to convert with (default: the module's
  `PATHS` beside it, written for the traced configuration). `as_written=False`:
  attention layers are checked with Linen's attention function only (see
  `_attention_variants`). Returns the largest tolerance a check used (0:
  every check bit for bit).
  """
  nnx_class = getattr(generated, type(linen_model.module).__name__)
  modes = dict(modes or {})
  fields = {**mode_fields(linen_model, modes), **fields_the_mode_sets(nnx_class, linen_model)}
  train_module = None
  if fields:
    # The model's own fields set its mode: Linen is checked in eval mode (the
    # fields at their eval values) against `model.eval()`, and with them at
    # their training values against `model.train()`.
    train_module = with_values(linen_model.module, fields)
    linen_model = LinenModel(
        with_values(linen_model.module, {f: not train for f, train in fields.items()}),
        *linen_model.args, **linen_model.kwargs,
    )
  # (A call's flags at their training values too, where the call has mode
  # flags beside the fields: `train` of a BatchNorm beside a merged
  # `deterministic`.)
  inputs, eval_kwargs, nnx_kwargs, train_kwargs = call_keywords(linen_model, modes)
  streams = drawn_streams(linen_model)
  if train_module is not None:  # what training draws (dropout) drawn alike in eval mode too
    streams = tuple(sorted({*streams, *drawn_streams(LinenModel(train_module, *linen_model.args,
                                                                **linen_model.kwargs))}))
  variables = linen_variables(linen_model, inputs, eval_kwargs, streams)
  context, mesh = annotation_context(variables)
  with context:
    if mesh is not None:  # whole on the mesh's one device, as NNX's arrays are
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      variables, inputs = jax.tree.map(lambda x: jax.device_put(x, replicated), (variables, inputs))
    paths = port_paths(generated) if paths is None else paths
    model = holding(nnx_class, linen_model, variables, paths, streams=streams)
    variants = _attention_variants(model, as_written)
    if holds_fused_cells(model):
      variants = [(candidate, max(atol, FUSED_CELL_ATOL)) for candidate, atol in variants]
    axis_name = batch_axis_name(linen_model)
    for candidate, atol in variants:
      assert_port_equivalent(
          linen_model.module, variables, candidate, *inputs, paths=paths,
          linen_kwargs=eval_kwargs, nnx_kwargs=nnx_kwargs, linen_train_kwargs=train_kwargs,
          linen_train_module=train_module, atol=atol,
          axis_name=axis_name, drawn_streams=streams,
      )
  return max(atol for _, atol in variants)


#: How far a port holding `nnx.OptimizedLSTMCell`s may be from Linen's
#: `OptimizedLSTMCell`s. Both compute the four gates with one product of
#: their kernels side by side, but Linen concatenates its eight gate
#: variables inside its program and NNX holds them concatenated, so XLA
#: may order the gradients' sums otherwise: a few ulp of float32 (1e-10 of
#: gradients of order 1e-3 seen). Relative to each leaf's largest value,
#: so that a wrong mapping (two gates swapped) is caught at any scale of
#: the model's outputs; the forward pass is the same program.
FUSED_CELL_ATOL = LeafRelative(1e-5)
#: The same over training steps: adam divides each step by the root of its
#: second moment, so for gradient entries near zero the rounding moves the
#: step by a share of the learning rate (up to about 1e-6 after 3 steps).
FUSED_CELL_TRAINING_ATOL = 1e-5


def holds_fused_cells(model: nnx.Module) -> bool:
  """Whether the port `model` holds `nnx.OptimizedLSTMCell`s (`FUSED_CELL_ATOL`)."""
  return any(isinstance(m, nnx.OptimizedLSTMCell) for _, m in nnx.iter_modules(model))


def training_atol(model: nnx.Module) -> float:
  """The tolerance of training steps of the port `model` against Linen's:
  0 (bit for bit) but where it holds `nnx.OptimizedLSTMCell`s
  (`FUSED_CELL_TRAINING_ATOL`)."""
  return FUSED_CELL_TRAINING_ATOL if holds_fused_cells(model) else 0.0

#: How far NNX's fused attention may be from Linen's (see `_attention_variants`).
FUSED_ATTENTION_ATOL = 1e-4


def _linen_attention_fn(query, key, value, *, is_causal: bool = False, module=None, **kwargs):
  """Linen's `dot_product_attention` called as `nnx.MultiHeadAttention`
  calls its `attention_fn` (`module` is NNX's, for sowing: not Linen's)."""
  if is_causal:
    raise AssertionError('is_causal=True has no Linen counterpart')
  return nn.dot_product_attention(query, key, value, **kwargs)


def with_linen_attention(model: nnx.Module) -> list[nnx.MultiHeadAttention]:
  """Gives `model`'s attention layers that would run NNX's fused attention
  (no dropout) Linen's attention function, in place; those layers."""
  fused = [m for _, m in nnx.iter_modules(model)
           if isinstance(m, nnx.MultiHeadAttention) and m.dropout_rate == 0
           and m.attention_fn is nnx.dot_product_attention]
  for m in fused:
    m.attention_fn = _linen_attention_fn
  return fused


def _fused_atol(layers) -> float:
  """The tolerance of NNX's fused attention against Linen's: a few ulp of
  float32 grown over layers (`FUSED_ATTENTION_ATOL`), or two ulp of the
  layers' computation dtype where it is coarser (bfloat16)."""
  eps = max(float(jnp.finfo(m.dtype or jnp.float32).eps) for m in layers)
  return max(FUSED_ATTENTION_ATOL, 2 * eps)


def _attention_variants(model: nnx.Module, as_written: bool = True) -> list[tuple[nnx.Module, float]]:
  """The models a proof checks, with their tolerance.

  Without dropout, `nnx.dot_product_attention` runs
  `jax.nn.dot_product_attention`, which rounds otherwise than Linen's
  einsums (a few ulp where the head size is not a power of 4), so a port
  using `nnx.MultiHeadAttention` as written is not Linen's program. It is
  proven twice: bit for bit with its attention layers given Linen's
  attention function (everything else as written: the same program as
  Linen's), then as written within `FUSED_ATTENTION_ATOL` (the kernels'
  rounding, of the layers' dtype: nothing a wrong port hides in, the
  first check is exact);
  `as_written=False` leaves the second out (a proof at another
  configuration, where the first proof made it already)."""
  swapped = nnx.clone(model)
  fused = with_linen_attention(swapped)
  if not fused:
    return [(model, 0.0)]
  return [(swapped, 0.0)] + ([(model, _fused_atol(fused))] if as_written else [])


def built(linen_model: LinenModel, fields: Mapping[str, Any], args: Sequence | None = None) -> LinenModel | None:
  """The model with `fields` changed (and `args` for its inputs), where
  Linen builds it on them (its `init` traced abstractly); None where Linen,
  or the configuration's own checks, refuse it."""
  try:
    other = LinenModel(linen_model.module.clone(parent=None, **fields),
                       *(linen_model.args if args is None else args), **linen_model.kwargs)
    inputs, eval_kwargs, *_ = call_keywords(other, {})
    jax.eval_shape(lambda: other.module.init(jax.random.key(0), *inputs, **eval_kwargs))
  except Exception:  # noqa: BLE001 - the user's model refuses that configuration, with any error
    return None
  return other


def _merged(base, first, second):
  """`first` with what `second` changes from `base` changed too (inside
  configuration dataclasses as well), or None where both change one value."""
  if second == base:
    return first
  if first == base:
    return second
  if not (_is_dataclass_instance(base)
          and type(first) is type(base) is type(second)):
    return None
  changes = {}
  for f in dataclasses.fields(base):
    if not f.init:
      continue
    merged = _merged(getattr(base, f.name), getattr(first, f.name), getattr(second, f.name))
    if merged is None:
      return None
    changes[f.name] = merged
  return dataclasses.replace(base, **changes)


def combined(linen_model: LinenModel, first: LinenModel, second: LinenModel) -> LinenModel | None:
  """The model with the flags `first` and `second` flip both flipped (the
  scanned layers decoding), or None where Linen does not build it."""
  module = linen_model.module
  changes = {}
  for name in shapes.module_fields(module):
    merged = _merged(getattr(module, name), getattr(first.module, name), getattr(second.module, name))
    if merged is None:
      return None
    changes[name] = merged
  return built(linen_model, changes)


def decoding_configurations(linen_model: LinenModel) -> list[tuple[LinenModel, str]]:
  """The model itself if it decodes (its `init` makes a `cache`), else each
  configuration with one flag flipped that does (`decode=True`)."""
  candidates = [(linen_model, 'as given')] + flag_configurations(linen_model)
  found = []
  for other, description in candidates:
    inputs, eval_kwargs, *_ = call_keywords(other, {})
    shapes_ = jax.eval_shape(lambda m=other.module, xs=inputs, kw=eval_kwargs: m.init(jax.random.key(0), *xs, **kw))
    if 'cache' in shapes_:
      if other is linen_model:
        return [(other, description)]
      found.append((other, description))
  return found


def configurations_without_decoding(linen_model: LinenModel) -> list[tuple[LinenModel, str]]:
  """For a model that decodes (its `init` makes a `cache`), each of its
  configurations with one flag flipped that does not (`decode=False`): the
  whole-sequence call, proven as any port is. Else none."""
  inputs, eval_kwargs, *_ = call_keywords(linen_model, {})
  own = jax.eval_shape(lambda: linen_model.module.init(jax.random.key(0), *inputs, **eval_kwargs))
  if 'cache' not in own:
    return []
  found = []
  for other, description in flag_configurations(linen_model):
    inputs, eval_kwargs, *_ = call_keywords(other, {})
    shapes_ = jax.eval_shape(lambda m=other.module, xs=inputs, kw=eval_kwargs: m.init(jax.random.key(0), *xs, **kw))
    if 'cache' not in shapes_:
      found.append((other, description))
  return found


def _decoding_input_shape(linen_model: LinenModel, variables) -> tuple[tuple[int, ...], Any]:
  """What the port's `init_cache` is given: the shape of the inputs of its
  attention layers in Linen's `init` (one shape for all, as NNX takes it),
  and the dtype of Linen's cached keys."""
  root, _ = tracing.trace(linen_model.module, *linen_model.args, **linen_model.kwargs)
  shapes_ = [
      tuple(c.calls[0].args[0].shape) for c in root.walk()
      if isinstance(c.module, nn.MultiHeadDotProductAttention) and c.module.decode and c.calls
  ]
  # NNX's attention reads the batch and length of `input_shape`, not its width.
  if len({s[:-1] for s in shapes_}) > 1:
    raise AssertionError(f'the attention layers decode inputs of shapes {sorted(set(shapes_))}; the '
                         "port's init_cache takes one batch and length: write its init_cache by hand")
  keys = [x for p, x in jax.tree_util.tree_flatten_with_path(variables.get('cache', {}))[0]
          if jax.tree_util.keystr(p).endswith("['cached_key']")]
  dtype = keys[0].dtype if keys else jnp.float32
  if shapes_:
    return shapes_[0], dtype
  first = next(x for x in linen_model.args if hasattr(x, 'shape'))
  return tuple(first.shape), dtype


def assert_generated_decoding(
    linen_model: LinenModel, generated: types.ModuleType, *, modes: Mapping[str, bool] | None = None,
    paths=None, as_written: bool = True,
) -> float:
  """The generated port of `linen_model`, a model that decodes, decodes as
  Linen does. Linen's `init` on the example inputs makes the cache (and the
  parameters); the port is built and given `init_cache` at the shape
  Linen's attention saw, and must make the same cache. Then every position
  of the inputs (`x[:, t:t + 1]`) is decoded on both sides, each from its
  own cache: the outputs and the caches the steps write must agree, bit
  for bit (NNX's fused attention as `_attention_variants` says). In eval
  mode. (Gradients and the rest `assert_port_equivalent` checks are the
  whole-sequence proof's, `assert_generated_port`.)
  `as_written` and the return value: as `assert_generated_port`'s."""
  nnx_class = getattr(generated, type(linen_model.module).__name__)
  paths = port_paths(generated) if paths is None else paths
  modes = dict(modes or {})
  fields = mode_fields(linen_model, modes)
  if fields:
    linen_model = LinenModel(
        with_values(linen_model.module, {f: not train for f, train in fields.items()}),
        *linen_model.args, **linen_model.kwargs,
    )
  inputs, eval_kwargs, nnx_kwargs, _ = call_keywords(linen_model, modes)
  streams = drawn_streams(linen_model)
  variables = linen_variables(linen_model, inputs, eval_kwargs, streams)
  shape, dtype = _decoding_input_shape(linen_model, variables)
  for x in inputs:
    if not hasattr(x, 'shape') or x.ndim < 2 or x.shape[1] < 2:
      raise AssertionError('decoding is proven on inputs (batch, length, ...) two positions long or more; '
                           f'the example inputs have {getattr(x, "shape", type(x).__name__)}')
  length = min(x.shape[1] for x in inputs)  # (an encoder's inputs and a decoder's targets may differ)
  context, mesh = annotation_context(variables)
  with context:
    if mesh is not None:
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      variables, inputs = jax.tree.map(lambda x: jax.device_put(x, replicated), (variables, inputs))
    model = holding(nnx_class, linen_model, variables, paths, cache_shape=(shape, dtype), streams=streams)
    model.init_cache(shape, dtype)  # the port's own cache, in place of Linen's
    _assert_same_cache('init_cache', variables['cache'], model, paths)
    variants = _attention_variants(model, as_written)
    def linen_call(variables, *xs):
      with linen_draws(streams):
        return linen_model.module.apply(variables, *xs, mutable=['cache'], **eval_kwargs)

    linen_step = jax.jit(linen_call)
    nnx_step = nnx.jit(lambda model, *xs: nnx_call(model, *xs, drawn_streams=streams, **nnx_kwargs))
    for candidate, atol in variants:
      candidate.eval()
      state = variables
      for t in range(length):
        position = tuple(x[:, t:t + 1] for x in inputs)
        expected, written = linen_step(state, *position)
        state = {**state, **written}
        actual = nnx_step(candidate, *position)
        for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
          difference = float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))
          if not (difference <= atol if atol else bool(jnp.array_equal(a, b))):
            raise AssertionError(f'decoding position {t}: outputs differ by {difference:.3g} (atol={atol:g}'
                                 + (", NNX's fused attention as written)" if atol else ')'))
        if not atol:
          _assert_same_cache(f'decoding position {t}', state['cache'], candidate, paths)
  return max(atol for _, atol in variants)


def _assert_same_cache(when: str, expected, model: nnx.Module, paths) -> None:
  """`model`'s cache is `expected` (Linen's), leaf by leaf through `paths`."""
  actual = nnx_to_linen(model, paths=paths).get('cache', {})
  flat = lambda tree: {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  expected, actual = flat(expected), flat(actual)
  rows = [f'{k}: only in Linen' for k in expected.keys() - actual.keys()]
  rows += [f'{k}: only in the port' for k in actual.keys() - expected.keys()]
  rows += [
      f'{k}: {"shape or dtype" if (expected[k].shape, expected[k].dtype) != (actual[k].shape, actual[k].dtype) else "values"} differ'
      for k in sorted(expected.keys() & actual.keys())
      if (expected[k].shape, expected[k].dtype) != (actual[k].shape, actual[k].dtype)
      or not bool(jnp.array_equal(expected[k], actual[k]))
  ]
  if rows:
    raise AssertionError(f"{when}: the port's cache is not Linen's: " + '; '.join(sorted(rows)))


def annotation_axes(variables) -> tuple[list[str], set[str]]:
  """`(mesh axes, logical names)` the variables' annotations need on a mesh
  where each resolves as written: the mesh axes they name (through their
  rules where they carry some) and, where the context has no rules, each
  logical name as an axis of its own; the logical names with no rules."""
  boxes = [
      leaf for leaf in jax.tree.leaves(variables, is_leaf=lambda x: isinstance(x, nn.Partitioned))
      if isinstance(leaf, nn.Partitioned)
  ]
  logical = {
      n for box in boxes if isinstance(box, nn.LogicallyPartitioned) and not box.rules
      for n in box.names if isinstance(n, str)
  }
  axes = set()
  for box in boxes:
    names = box.names
    if isinstance(box, nn.LogicallyPartitioned):
      if not box.rules:
        continue
      names = tuple(nn.logical_to_mesh_axes(box.names, box.rules))  # the mesh axes its rules give
    for n in names:
      axes |= {n} if isinstance(n, str) else set(n or ())
  if not nn.get_logical_axis_rules():
    axes |= logical  # each logical name to a mesh axis of its own: names that differ, differ
  return sorted(axes) or ['replicated'], logical


def annotation_context(variables) -> tuple[contextlib.AbstractContextManager, jax.sharding.Mesh | None]:
  """Where a port with sharding annotations is built and checked when the
  caller gives no mesh: a mesh of one device with an axis of size one for
  each mesh axis the annotations name and, where the context has no rules,
  for each logical name, with rules sending each name to its own axis. NNX
  creates annotated Variables sharded (eager sharding), which needs both;
  every array is whole on the one device, and two annotations resolve alike
  only if they name the same axes in the same order."""
  if not jax.sharding.get_abstract_mesh().empty:
    return contextlib.nullcontext(), None
  if not any(isinstance(x, nn.Partitioned) for x in jax.tree.leaves(
      variables, is_leaf=lambda x: isinstance(x, nn.Partitioned))):
    return contextlib.nullcontext(), None
  axes, logical = annotation_axes(variables)
  mesh = jax.make_mesh((1,) * len(axes), tuple(axes), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,) * len(axes))
  stack = contextlib.ExitStack()
  stack.enter_context(jax.set_mesh(mesh))
  if logical and not nn.get_logical_axis_rules():
    stack.enter_context(nn.logical_axis_rules(tuple((n, n) for n in sorted(logical))))
  return stack, mesh


def _placement():
  """With no mesh in context, sharding annotations are compared as what
  they say (metadata) and nothing is placed: NNX's eager sharding is off, as
  Linen's `init` places nothing without a mesh either. Under the caller's
  `jax.set_mesh(...)` (and rules), both place as they would."""
  if jax.sharding.get_abstract_mesh().empty:
    return nnx.use_eager_sharding(False)
  return contextlib.nullcontext()



def _in_fields(value, change, named: bool = False):
  """`(value, changes)` of a configuration dataclass with `change` (a field's
  value, and with `named` its name -> `(new value, changes)`) applied to
  each of its fields; `value` as it is where nothing changes or the
  configuration refuses the change."""
  changes, new = [], {}
  for f in dataclasses.fields(value):
    if f.init:
      v, c = change(getattr(value, f.name), f.name) if named else change(getattr(value, f.name))
      if c:
        new[f.name] = v
        changes += [_named(f.name, x) for x in c]
  if not new:
    return value, []
  try:
    return dataclasses.replace(value, **new), changes
  except Exception:  # noqa: BLE001 - the configuration refuses the change
    return value, []


def _is_sizes(value) -> bool:
  """A tuple or list of integers (`widths`, ResNet's `stage_sizes=[2, 2]`)."""
  return isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _changed(value, depth: int = 0, scale: int | None = None, entries: bool = False):
  """Each integer one more (or `scale` times itself) and each tuple of
  integers one longer (its last entry again; or, `entries`, each entry one
  more: a patch size `(8, 8)` as `(9, 9)`; with `scale`, each entry scaled),
  inside configuration dataclasses, namespaces and dicts too (vit_jax's
  `patches.size`); `(value, changes)`."""
  if isinstance(value, bool) or depth > 3:
    return value, []
  if isinstance(value, int):
    new = value * scale if scale else value + 1
    return new, [f'{new}']
  if _is_sizes(value) and value:
    if scale:
      new = type(value)(v * scale for v in value)
    else:
      new = type(value)(v + 1 for v in value) if entries else value + value[-1:]
    return new, [repr(new)]
  return _inside(value, lambda v: _changed(v, depth + 1, scale, entries))


def _inside(value, inner, named: bool = False):
  """`(value, changes)` of a configuration (a dataclass, a namespace, a dict
  of names) with `inner` applied to each of its fields or members (with
  `named`, to each and its name); `(value, [])` for anything else."""
  if _is_dataclass_instance(value):
    return _in_fields(value, inner, named)
  if isinstance(value, types.SimpleNamespace):
    new, changes = _in_members(vars(value), inner, named)
    return (types.SimpleNamespace(**new), changes) if changes else (value, [])
  if type(value) in (dict, FrozenDict) and all(isinstance(k, str) for k in value):
    new, changes = _in_members(dict(value), inner, named)
    return (type(value)(new), changes) if changes else (value, [])
  return value, []


def _named(name: str, change: str) -> str:
  """A change of the field or member `name` as the report says it:
  `hidden=9`, or `config.hidden=9` for a change inside it."""
  return f'{name}={change}' if '=' not in change else f'{name}.{change}'


def _in_members(members: dict, change, named: bool = False) -> tuple[dict, list[str]]:
  """`members` with `change` applied to each (with `named`, to each and its
  name), and what changed (`size=(9, 9)`)."""
  new, changes = dict(members), []
  for name, member in members.items():
    v, c = change(member, name) if named else change(member)
    if c:
      new[name] = v
      changes += [_named(name, x) for x in c]
  return new, changes


def _is_dataclass_instance(value) -> bool:
  return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _is_configuration(value) -> bool:
  """A value holding fields of its own: a dataclass, a namespace, a dict."""
  return _is_dataclass_instance(value) or isinstance(
      value, (types.SimpleNamespace, dict, FrozenDict))


def _flipped(value, depth: int = 0):
  """Every configuration of `value` with one flag (a bool, also inside
  configuration dataclasses) flipped: `[(value, 'name=True'), ...]`."""
  if depth > 3 or not _is_dataclass_instance(value):
    return []
  out = []
  for f in dataclasses.fields(value):
    if not f.init:
      continue
    v = getattr(value, f.name)
    if isinstance(v, bool):
      changes = [({f.name: not v}, f'{f.name}={not v}')]
    else:
      changes = [({f.name: new}, f'{f.name}.{c}') for new, c in _flipped(v, depth + 1)]
    for change, description in changes:
      try:
        out.append((dataclasses.replace(value, **change), description))
      except Exception:  # noqa: BLE001 - the configuration refuses the change
        continue
  return out


def flag_configurations(linen_model: LinenModel, refused: list[str] | None = None) -> list[tuple[LinenModel, str]]:
  """The model with each flag of its configuration flipped (`scan_layers`,
  `use_bias`), where Linen builds it on the same inputs: the code a flag
  switches on is traced, written and proven too. The flips Linen does not
  build are added to `refused` (their descriptions), if given."""
  module = linen_model.module
  found = []
  for name in shapes.module_fields(module):
    value = getattr(module, name)
    variants = ([(not value, f'{name}={not value}')] if isinstance(value, bool)
                else [(v, f'{name}.{c}') for v, c in _flipped(value)])
    for new, description in variants:
      if (other := built(linen_model, {name: new})) is None:
        if refused is not None:
          refused.append(description)
        continue
      found.append((other, description))
  return found


#: Values tried for a field left None, by its annotated type, until Linen
#: builds the model (a width a multiple of a number of heads, a rate below
#: one); integers the model already holds are tried last (`_given_values`).
_GIVEN_VALUES = {
    int: (12, 16, 8, 24, 3, 2, 1), float: (0.5, 0.25, 2.0), bool: (True, False),
    # an initializer (`posemb_init`, `bias_init`), else an activation
    typing.Callable: (nn.initializers.normal(stddev=0.02), jax.nn.tanh),
}


def _shown(value) -> str:
  """A value given to a field, as the report names it."""
  if callable(value):
    return 'an initializer' if value is _GIVEN_VALUES[typing.Callable][0] else getattr(value, '__name__', 'a function')
  return repr(value)


def _integers_held(value, depth: int = 0) -> set[int]:
  """Every integer in a configuration (and its tuples and dataclasses)."""
  if isinstance(value, bool) or depth > 3:
    return set()
  if isinstance(value, int):
    return {value}
  if isinstance(value, (tuple, list)):
    return set().union(*(_integers_held(v, depth + 1) for v in value))
  if _is_dataclass_instance(value):
    return set().union(*(_integers_held(getattr(value, f.name), depth + 1)
                         for f in dataclasses.fields(value) if f.name not in ('parent', 'name')))
  return set()


def _given_values(kind: type, held: set[int]) -> tuple:
  """The values tried for a field of type `kind` left None: for integers,
  those no size of the model already is first (a width given as the
  input's own would hide the branch that ignores it)."""
  values = _GIVEN_VALUES[kind]
  if kind is not int:
    return values
  return tuple(v for v in values if v not in held) + tuple(v for v in values if v in held)


def _admits(owner: type, name: str, *kinds: type) -> bool:
  """Whether the annotation of field `name` of `owner` admits each of
  `kinds` (big_vision's `rep_size: Union[int, bool] = False` admits `int`
  and `bool`; `mlp_dim: Optional[int]`, `type(None)`), as a union of them."""
  try:
    hint = typing.get_type_hints(owner).get(name)
  except Exception:  # noqa: BLE001 - an annotation that names what it cannot resolve
    hint = None
  if hint is None:  # read as written: a name of each, outside brackets of another type's
    text = str(getattr(owner, '__annotations__', {}).get(name, ''))
    if re.search(r'Callable|\[\[', text):
      return False
    names = {int: r'\bint\b', bool: r'\bbool\b', type(None): r'\bNone\b|\bOptional\b'}
    return all(re.search(names[k], text) for k in kinds)
  admitted = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
  return all(k in admitted for k in kinds)


def _annotated_type(owner: type, name: str) -> type | None:
  """The one type of `int`, `float`, `bool`, `typing.Callable` (for a
  callable or `Any`: an initializer, as Flax's configurations hold them)
  that the annotation of field `name` of `owner` admits beside None (`int |
  None`, `Optional[float]`), else None."""
  try:
    hint = typing.get_type_hints(owner).get(name)
  except Exception:  # noqa: BLE001 - an annotation that names what it cannot resolve
    hint = None
  if hint is None:
    text = str(getattr(owner, '__annotations__', {}).get(name, ''))
    found = [t for t in (bool, int, float) if re.search(rf'\b{t.__name__}\b', text)]
    if not found and re.search(r'\bCallable\b', text):
      return typing.Callable
    return found[0] if len(found) == 1 else None
  kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
  if kinds == [typing.Any]:  # what Flax's configurations hold initializers as
    return typing.Callable
  if len(kinds) == 1 and typing.get_origin(kinds[0]) is collections.abc.Callable or kinds == [collections.abc.Callable]:
    return typing.Callable
  found = [t for t in (bool, int, float) if t in kinds]
  return found[0] if len(kinds) == 1 and found else None


def _replaced(value, name: str, new):
  """`value` with field `name` set to `new` (a dict of it for a Linen
  module, which `clone` takes), or None where the configuration refuses
  it (its `__post_init__` checks)."""
  if isinstance(value, nn.Module):
    return {name: new}
  try:
    return dataclasses.replace(value, **{name: new})
  except Exception:  # noqa: BLE001 - the configuration refuses the value
    return None


def _configuration_fields(value, prefix: str, depth: int):
  """`(field, its value, its dotted name)` of each field a user sets of
  the configuration `value` (a module's fields, or a configuration
  dataclass's, nested): none of a value that is no dataclass, nor deeper
  than three levels."""
  if depth > 3 or not _is_dataclass_instance(value):
    return
  for f in dataclasses.fields(value):
    if f.init and f.name not in ('parent', 'name'):
      yield f, getattr(value, f.name), f'{prefix}{f.name}'


def _given_a_value(value, owner: type, prefix: str, depth: int = 0, held: frozenset = frozenset()):
  """`(changes, unvaried)`: for each field of the configuration `value` (a
  module's fields, or a configuration dataclass's, nested) left None,
  `([(new value, 'name=given'), ...])` with each value of its annotated
  type (and for a flag annotated to take an integer too, each integer);
  and the fields left None that take no value the kit can give (a
  callable, a string)."""
  changes, unvaried = [], []
  for f, current, name in _configuration_fields(value, prefix, depth):
    if current is None:
      kind = _annotated_type(owner, f.name)
      if kind is None:
        unvaried.append(name)
        continue
      tried = [(_replaced(value, f.name, v), f'{name}={_shown(v)}') for v in _given_values(kind, held)]
      changes.append([(new, d) for new, d in tried if new is not None] or [(None, f'{name}=')])
    elif isinstance(current, bool) and _admits(owner, f.name, int, bool):
      # A flag the flips prove, that takes a width as well (`rep_size=8`:
      # a layer of that width, where True makes one of the model's own).
      tried = [(_replaced(value, f.name, v), f'{name}={v}') for v in _given_values(int, held)]
      changes.append([(new, d) for new, d in tried if new is not None] or [(None, f'{name}=')])
    elif isinstance(current, int) and _admits(owner, f.name, int, bool):
      # A width that takes a flag as well: each flag in turn (`rep_size=False`).
      changes += [[(_replaced(value, f.name, v), f'{name}={v}')] for v in (False, True)]
    elif _is_dataclass_instance(current):
      inner, more = _given_a_value(current, type(current), f'{name}.', depth + 1, held)
      unvaried += more
      for tried in inner:
        wrapped = [(_replaced(value, f.name, new) if new is not None else None, d) for new, d in tried]
        changes.append([(new, d) for new, d in wrapped if new is not None] or [(None, tried[0][1])])
  return changes, unvaried


def optional_configurations(linen_model: LinenModel) -> tuple[list[tuple[LinenModel, str]], list[str]]:
  """The model with each field left None (`out_dim: int | None = None`, in
  its configuration dataclasses too) given a value in turn, the first of
  `_GIVEN_VALUES` of its annotated type that Linen builds, integers no size
  of the model already is first: the branch the
  traced configuration did not take is proven too, or the port fails
  there. Also the fields that stay unproven, each with why."""
  module = linen_model.module
  shapes_given = [x.shape for x in jax.tree.leaves((linen_model.args, dict(linen_model.kwargs)))
                  if hasattr(x, 'shape')]
  held = frozenset(_integers_held(module) | _integers_held(shapes_given))
  changes, unvaried = _given_a_value(module, type(module), '', held=held)
  found, unproven = [], [(name, 'takes no value of a type the kit can give') for name in unvaried]
  for tried in changes:
    for fields, description in tried:
      if (other := built(linen_model, fields)) is None:
        continue  # refused: the next value
      found.append((other, description))
      break
    else:
      unproven.append((tried[0][1].split('=')[0], 'no value Linen builds'))
  return found, unproven


def _switched(value, prefix: str, strings: dict, depth: int = 0) -> tuple[list, list[str]]:
  """`(changes, unknown)`: for each string or enum field of the
  configuration `value` (a module's fields, or a configuration dataclass's,
  nested), `(new value, 'name=other')` for every other value the sources
  switch on; and the string fields whose values no source names."""
  changes, unknown = [], []
  for f, current, name in _configuration_fields(value, prefix, depth):
    if _is_dataclass_instance(current):
      inner, more = _switched(current, f'{name}.', strings, depth + 1)
      unknown += more
      changes += [(new, d) for inner_new, d in inner
                  if (new := _replaced(value, f.name, inner_new)) is not None]
      continue
    others = switches.alternatives(current, f.name, strings)
    if others is None:
      unknown.append(name)
    for other in others or ():
      if (new := _replaced(value, f.name, other)) is not None:
        changes.append((new, f'{name}={other!r}' if isinstance(other, str) else f'{name}={other}'))
  return changes, unknown


def _left_none(value, prefix: str, depth: int = 0) -> list[tuple[object, str]]:
  """`(new value, 'name=None')` for each field of the configuration `value`
  (a module's fields, or a configuration dataclass's, nested) whose default
  is None, or whose annotation admits None, and that holds something else."""
  changes = []
  for f, current, name in _configuration_fields(value, prefix, depth):
    if current is not None and (f.default is None or _admits(type(value), f.name, type(None))) and (
        new := _replaced(value, f.name, None)) is not None:
      changes.append((new, f'{name}=None'))
    if _is_dataclass_instance(current):
      changes += [(new, d) for inner, d in _left_none(current, f'{name}.', depth + 1)
                  if (new := _replaced(value, f.name, inner)) is not None]
  return changes


def default_configurations(linen_model: LinenModel) -> tuple[list[tuple[LinenModel, str]], list]:
  """The model with each field whose default is None or whose annotation
  admits None, and that the model sets (`mlp_dim=32` of `mlp_dim: int |
  None = None`, in its configuration dataclasses too), left None in turn, where Linen builds it: the branch
  the default takes (`self.mlp_dim or 4 * d`) is written and proven too.
  Also `(change, why)` of those Linen does not build."""
  found, unproven = [], []
  for fields, description in _left_none(linen_model.module, ''):
    if (other := built(linen_model, fields)) is None:
      unproven.append((description, 'not built by Linen'))
      continue
    found.append((other, description))
  return found, unproven


def switched_configurations(linen_model: LinenModel, classes) -> tuple[list[tuple[LinenModel, str]], list]:
  """The model with each string or enum field of its configuration (in its
  configuration dataclasses too) set in turn to every other value the
  sources of `classes` switch on (`if self.activation == 'gelu'`, every
  member of an enum), where Linen builds it: each branch is traced, written
  and proven. Also `(field, why)` of the string fields left unproven."""
  module = linen_model.module
  strings = switches.named_strings(switches.source_paths(classes))
  changes, unknown = _switched(module, '', strings)
  found = []
  unproven = [(name, 'a string no source compares: its other values are unknown') for name in unknown
              if name.split('.')[-1] not in ('dtype', 'param_dtype', 'precision')]
  for fields, description in changes:
    if (other := built(linen_model, fields)) is None:
      unproven.append((description, 'not built by Linen'))
      continue
    found.append((other, description))
  return found, unproven


def _moved(value, how: str, looped: Collection[str], name: str = '', depth: int = 0):
  """`(value, changes)` with every float moved (`how == 'floats'`, or
  `'floats doubled'`), every tuple of integers the sources loop over
  (`looped`, by the field's `name`) emptied (`how == 'empty'`: a loop over
  none of them) or, of two or more, one shorter (`how == 'shorter'`),
  inside configuration dataclasses, namespaces and dicts too."""
  if depth > 3:
    return value, []
  if how == 'floats' and isinstance(value, float):
    # Doubled (an epsilon, a scale, a rate below one half), a rate from one
    # half halfway to 1, 0.5 for 0: never a rate of 1 or more.
    new = (value + 1) / 2 if 0.5 <= value < 1 else (value * 2 if value else 0.5)
    return new, [f'{new!r}']
  if how == 'floats doubled' and isinstance(value, float):
    # Where Linen refuses the above (a width factor of 0.75 whose width
    # GroupNorm's 32 groups do not divide): doubled, 0.5 for 0.
    new = value * 2 if value else 0.5
    return new, [f'{new!r}']
  if how in ('shorter', 'empty') and _is_sizes(value):
    # (Not a tuple only handed to a layer: `patch_size=()` builds in Linen,
    # a convolution over no axes, which no port is written for.)
    if name not in looped or not value or how == 'shorter' and len(value) < 2:
      return value, []
    new = value[:-1] if how == 'shorter' else type(value)()
    return new, [repr(new)]
  if how.startswith('floats') or _is_configuration(value):  # (vit_jax's `resnet.num_layers`, a namespace's)
    return _inside(value, lambda v, n: _moved(v, how, looped, n, depth + 1), named=True)
  return value, []


def moved_configurations(linen_model: LinenModel, looped: Collection[str]) -> list[tuple[LinenModel, str]]:
  """The model with every float of its configuration moved (a scale, an
  epsilon, a rate: a traced float written into the port shows) and every
  tuple of integers the sources loop over (`looped`: `switches.looped_over`)
  empty (a loop over none: a size read from its last entry shows), else one
  shorter, both in one configuration where Linen builds it (one proof),
  else each alone: `[(LinenModel, description)]`."""
  module = linen_model.module
  names = shapes.module_fields(module)

  def moved(hows):
    fields, changes = {}, []
    for name in names:
      value, change = getattr(module, name), []
      for how in hows:
        value, more = _moved(value, how, looped, name)
        change += more
      if change:
        fields[name] = value
        changes += [_named(name, c) for c in change]
    return fields, ', '.join(changes)

  def moved_model(hows) -> tuple[LinenModel, str] | None:
    fields, description = moved(hows)
    other = built(linen_model, fields) if fields else None
    return None if other is None else (other, description)

  # Both at once (one proof), else the floats, then the tuples, alone.
  for together in itertools.product(('floats', 'floats doubled'), ('empty', 'shorter')):
    if (found := moved_model(together)) is not None:
      return [found]
  alone = [moved_model(('floats',)) or moved_model(('floats doubled',)),
           next((f for f in map(moved_model, (('empty',), ('shorter',))) if f is not None), None)]
  return [f for f in alone if f is not None]


def _tied(args: Sequence, ties: Mapping[shapes.InputDim, shapes.FieldValue], module, fields: Mapping) -> list:
  """`args` with each input size tied to a field (`ties`) set to that
  field's value where `fields` changes it (else as traced): the inputs the
  port is written for."""
  args = list(args)
  for dim, field in ties.items():
    name, *access = field.access
    value = shapes.value_at(fields.get(name, getattr(module, name)), access)
    x = args[dim.index]
    if hasattr(x, 'shape') and len(x.shape) == dim.ndim and x.shape[dim.dim] != value:
      shape = tuple(value if d == dim.dim else n for d, n in enumerate(x.shape))
      args[dim.index] = jax.ShapeDtypeStruct(shape, x.dtype)
  return args


def tie_descriptions(ties: Mapping[shapes.InputDim, shapes.FieldValue]) -> list[str]:
  """What the port assumes of its inputs, one line a tie: `inputs.shape[-1]
  == self.channels`."""
  return [
      f'{dim.name}.shape[{dim.dim - dim.ndim}] == self.{shapes.access_source(field.access, field.last)}'
      for dim, field in ties.items()
  ]


def other_configurations(linen_model: LinenModel, most: int = 1,
                         ties: Mapping[shapes.InputDim, shapes.FieldValue] | None = None):
  """Up to `most` other configurations of the model that Linen builds:
  `(LinenModel, description)`. Every integer of the configuration one more
  and every tuple one longer (or the tuples alone, or the integers alone),
  with every floating input one wider, else on the same inputs; else the
  wider inputs alone. An input size the port takes to be a field (`ties`)
  is that field's value in each."""
  ties = ties or {}
  module = linen_model.module
  names = shapes.module_fields(module)
  attempts = []
  # `entries`: the tuples as long, each entry one more, where a longer one
  # does not build (a patch or kernel size of two axes).
  for keep in ('both', 'entries', 'tuples', 'integers'):
    fields, changes = {}, []
    for name in names:
      value = getattr(module, name)
      new, change = _changed(value, entries=keep == 'entries')
      is_tuple = isinstance(value, (tuple, list))
      if change and (keep in ('both', 'entries') or (keep == 'tuples') == (is_tuple or _is_configuration(value))):
        fields[name] = new
        changes += [_named(name, c) for c in change]
    if fields:
      attempts.append((fields, ', '.join(changes)))
  # The inputs too: each floating array one wider (its last axis), which the
  # sizes read from the inputs must follow.
  floating = [hasattr(x, 'shape') and x.shape and jnp.issubdtype(x.dtype, jnp.floating) for x in linen_model.args]
  wider = [jax.ShapeDtypeStruct(x.shape[:-1] + (x.shape[-1] + 1,), x.dtype) if f else x
           for x, f in zip(linen_model.args, floating)]
  tried = [(fields, changes, wider) for fields, changes in attempts] if any(floating) else []
  tried += [(fields, changes, list(linen_model.args)) for fields, changes in attempts]
  if any(floating):
    tried.append(({}, '', wider))
  # Every integer doubled keeps what +1 may break (a width a multiple of the
  # number of heads).
  doubled, changes = {}, []
  for name in names:
    new, change = _changed(getattr(module, name), scale=2)
    if change:
      doubled[name] = new
      changes += [_named(name, c) for c in change]
  if doubled:
    # Tried before the rest when two are wanted: it breaks other coincidences
    # than +1 does (a layer's width equal to the input's).
    tried.insert(1 if most > 1 and tried else len(tried), (doubled, ', '.join(changes), list(linen_model.args)))
  found = []
  for fields, changes, args in tried:
    args = _tied(args, ties, module, fields)  # the inputs the port is written for, described as given
    args_changes = [
        f'input {i} {tuple(x.shape)} -> {tuple(a.shape)}' for i, (x, a) in enumerate(zip(linen_model.args, args))
        if hasattr(x, 'shape') and tuple(x.shape) != tuple(a.shape)
    ]
    description = ', '.join(c for c in [changes, *args_changes] if c)
    if not description or any(description == d for _, d in found):
      continue  # the same changes by another road (tuples alone, when they are all)
    if (other := built(linen_model, fields, args)) is None:
      continue  # refused: the next
    found.append((other, description))
    if len(found) == most:
      break
  return found
