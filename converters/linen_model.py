"""`LinenModel`: a Linen module with the example inputs of one forward pass.

A Linen module holds no variables: what they are (paths, shapes, dtypes,
annotations) is known only by tracing `init` on inputs. Whatever must know a
Linen model without running it takes it as `LinenModel(module, *args,
**kwargs)`: `paths='infer'` of the conversions (with `converters.inference`)
and the checkpoint tool's abstract training states (`converters.checkpoint`).

Either side of a port may also be given as a factory: a function returning
the `LinenModel` or the NNX module. A factory with a `layout` parameter
(`'loop'` or `'scan'`) makes both layouts of its model, which is what scan <->
loop conversions need to infer both layouts' paths.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator

import jax
from flax import linen as nn
from flax import nnx
from flax.training.train_state import TrainState

#: The layouts a factory with a `layout` parameter makes.
LAYOUTS = ('loop', 'scan')


class LinenModel:
  """A Linen module and the example inputs its `init` is traced with.

  `LinenModel(module, *args, **kwargs)` stands for `module.init(rngs, *args,
  **kwargs)` and `module.apply(variables, *args, **kwargs)`; the inputs may
  be arrays or `jax.ShapeDtypeStruct`s (nothing is computed). A keyword
  argument holding arrays (`inputs=tokens`, as Flax's examples call their
  models) is an input of both models, the NNX port called with it too
  (`keyword_inputs`); any other (`train=False`) is a setting of the Linen
  call alone (`settings`). `train_state`
  is the `TrainState` class a training loop saves (default: `TrainState` with
  a field per collection beside `params`).
  """

  def __init__(self, module: nn.Module, *args, train_state: type | None = None, **kwargs):
    if not isinstance(module, nn.Module):
      raise TypeError(
          f'LinenModel takes a flax.linen Module first, got {type(module).__name__}; '
          'write LinenModel(MyModule(config), example_input, ...)'
      )
    if train_state is not None and not (
        isinstance(train_state, type) and issubclass(train_state, TrainState)
    ):
      raise TypeError(f'train_state must be a TrainState subclass, got {train_state!r}')
    self.module, self.args, self.kwargs, self.train_state = module, args, kwargs, train_state

  @property
  def keyword_inputs(self) -> dict:
    """The keyword arguments holding arrays: inputs of both models."""
    return {k: v for k, v in self.kwargs.items() if any(map(is_array, jax.tree.leaves(v)))}

  @property
  def settings(self) -> dict:
    """The other keyword arguments: settings of the Linen call alone."""
    return {k: v for k, v in self.kwargs.items() if k not in self.keyword_inputs}

  def __repr__(self) -> str:
    inputs = len(self.args) + len(self.keyword_inputs)
    return f'LinenModel({type(self.module).__name__}, {inputs} example inputs)'


@contextlib.contextmanager
def nothing_sown() -> Iterator[None]:
  """Linen's `self.sow` keeps nothing within the context, as in a call that
  does not ask for the collection: `init` makes the model's state, not the
  values it sows (Flax leaves `intermediates` out of `init` itself, but
  keeps an auxiliary loss sown into `losses`); an NNX port's sown values
  are outputs of a call (`nnx.Intermediate`)."""
  original = nn.Module.sow

  def sow(self, col, name, value, *args, **kwargs):
    return False

  nn.Module.sow = sow
  try:
    yield
  finally:
    nn.Module.sow = original


def split_arrays(args: tuple, kwargs: dict) -> tuple[Callable[..., tuple[tuple, dict]], list]:
  """`(rebuild, arrays)`: the arrays among a call's arguments (what a trace
  takes as its inputs), and `rebuild(*arrays)` giving back `(args,
  kwargs)` with them in place; the rest (flags such as `train=False`, which
  Linen code branches on, a count) stays Python values."""
  leaves, treedef = jax.tree.flatten((tuple(args), dict(kwargs)))
  dynamic = [i for i, x in enumerate(leaves) if is_array(x)]

  def rebuild(*arrays):
    full = list(leaves)
    for i, x in zip(dynamic, arrays, strict=True):
      full[i] = x
    return jax.tree.unflatten(treedef, full)

  return rebuild, [leaves[i] for i in dynamic]


def is_array(x) -> bool:
  """Whether `x` is an array or stands for one (`jax.ShapeDtypeStruct`)."""
  return isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) or hasattr(x, 'aval') or (
      hasattr(x, 'shape') and hasattr(x, 'dtype')
  )


def accepts_layout(factory: Callable) -> bool:
  """Whether `factory` takes a `layout` argument (makes both layouts)."""
  if not callable(factory) or isinstance(factory, (LinenModel, nn.Module, nnx.Module)):
    return False
  try:
    return 'layout' in inspect.signature(factory).parameters
  except (TypeError, ValueError):
    return False
