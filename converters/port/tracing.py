"""What a Linen model does when it is initialised: the modules it creates,
where in the source, and what each call receives.

`trace(module, *args, **kwargs)` runs `module.init` abstractly
(`jax.eval_shape`) and records every module created (the class, the object,
the source position of the expression that created it) and every method
called on one (the position of the call, the abstract inputs), in the order
they happened. Inputs may be concrete or symbolic (`jax.export` dimensions):
a symbolic trace tells how the sizes Linen infers depend on the
configuration. Positions are those of Python's own code objects (line and
column of the whole call expression), which is what `converters.port.source`
finds the expression by.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Iterator
from typing import Any

import flax
import jax
from flax import linen as nn
from flax.core import scope as flax_scope

from converters import compat
from converters.linen_model import is_array, nothing_sown, split_arrays

# Frames inside these are the machinery between the user's code and the event:
# Flax, JAX, this package, and Python's standard library (dataclasses'
# generated `__init__`, `functools.partial`).
_SKIPPED = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (flax, jax)
) + (os.path.dirname(__file__) + os.sep, os.path.dirname(dataclasses.__file__) + os.sep)


@dataclasses.dataclass(frozen=True)
class Site:
  """Where an expression is: file, 1-based lines, 0-based columns (UTF-8)."""

  filename: str
  line: int
  column: int
  end_line: int
  end_column: int

  def __str__(self) -> str:
    return f'{self.filename}:{self.line}:{self.column + 1}'


@dataclasses.dataclass
class MethodCall:
  """One call of a module's method: its name, where it was called, and its
  inputs (arrays as `jax.ShapeDtypeStruct`s, the rest as they were)."""

  method: str
  site: Site | None
  args: tuple
  kwargs: dict
  outputs: Any = None


def _inputs_by_position(method, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
  """A call's inputs with the arrays given by keyword for the parameters
  right after the positional ones (`dense(inputs=x)`, `block(x=h)`) moved
  into place, as a call by position gives them: the same call, its inputs
  read by position alike however they were written. Flags stay keywords
  (`train=`, which the checks flip by name)."""
  if not kwargs:
    return args, kwargs
  parameters = parameters_after_self(method)
  moved, rest = list(args), dict(kwargs)
  for parameter in parameters[len(args):]:
    if (parameter.kind is not parameter.POSITIONAL_OR_KEYWORD or parameter.name not in rest
        or not hasattr(rest[parameter.name], 'shape')):
      break
    moved.append(rest.pop(parameter.name))
  return tuple(moved), rest


def parameters_after_self(method) -> tuple[inspect.Parameter, ...]:
  """The parameters of a module's method after `self` (none where its
  signature cannot be read); read once per method."""
  try:
    return _parameters_after_self(method)
  except TypeError:  # an unhashable callable: read each time
    return _read_parameters(method)


def _read_parameters(method) -> tuple[inspect.Parameter, ...]:
  try:
    return tuple(inspect.signature(method).parameters.values())[1:] if method is not None else ()
  except (TypeError, ValueError):
    return ()


_parameters_after_self = functools.lru_cache(maxsize=4096)(_read_parameters)  # (at every call traced)


@dataclasses.dataclass(eq=False)
class Created:
  """A module the model created: its object, where, its calls, its children."""

  module: nn.Module
  site: Site | None
  parent: Created | None
  calls: list[MethodCall] = dataclasses.field(default_factory=list)
  children: list[Created] = dataclasses.field(default_factory=list)
  #: The user's frames the creation happened in, innermost first (`site`,
  #: then the call of the helper function that made it, ...).
  stack: tuple[Site, ...] = ()
  #: For a module Linen's `nn.scan` / `nn.remat` made of a user's class: the
  #: class Linen made (`ScanCheckpointBlock`). `module`, `calls` and
  #: `children` are then those of the user's module as the transform ran it
  #: (one layer, per-layer shapes), found under the same path.
  transform: type | None = None
  #: The methods of the module decorated with a lifted transform (`nn.scan`
  #: over time): Linen runs them on a clone of the module, per step; their
  #: calls here are with the whole inputs, and the submodules they created
  #: (found on the clone, under the same path) are the module's children.
  lifted_methods: tuple[str, ...] = ()
  #: The names its calls reserved in its scope (variables and submodules),
  #: in order: those of a module sharing its parent's scope
  #: (`nn.share_scope`) are its own among the parent's.
  reserved: list[str] = dataclasses.field(default_factory=list)

  @property
  def cls(self) -> type:
    return type(self.module)

  @property
  def path(self) -> tuple[str, ...]:
    """The scope path (`('Block_0', 'Dense_1')`), `()` for the model."""
    scope = self.module.scope
    return tuple(scope.path) if scope is not None else ()

  @property
  def name(self) -> str:
    return self.path[-1] if self.path else ''

  @property
  def shares_scope(self) -> bool:
    """Whether it keeps its variables in its parent's scope (`nn.share_scope`)."""
    return self.parent is not None and self.path == self.parent.path

  def walk(self) -> Iterator[Created]:
    yield self
    for child in self.children:
      yield from child.walk()


def _user_frame(frame):
  """The first frame outside Flax, JAX, dataclasses and this package."""
  while frame is not None:
    filename = frame.f_code.co_filename
    if not (filename.startswith(_SKIPPED) or filename.startswith('<')):
      return frame
    frame = frame.f_back
  return None


def _user_stack(frame, most: int = 8) -> tuple[Site, ...]:
  """The sites of the first `most` user frames from `frame` outwards."""
  sites = []
  frame = _user_frame(frame)
  while frame is not None and len(sites) < most:
    site = _site(frame)
    if site is not None:
      sites.append(site)
    frame = _user_frame(frame.f_back)
  return tuple(sites)


def _site(frame) -> Site | None:
  if frame is None:
    return None
  line, end_line, column, end_column = _positions(frame.f_code)[frame.f_lasti // 2]
  if line is None:
    return None
  return Site(_real_path(frame.f_code.co_filename), line, column, end_line, end_column)


# A trace reads the site of every creation and call, up to eight frames each:
# a code object's positions and a file's real path are read once, not per
# frame (read per frame, they were a tenth of the time to write a port).
# Positions are the code's own (code objects equal as values have equal
# positions); real paths are read again at each trace, where a link may have
# changed since the last.
@functools.lru_cache(maxsize=512)
def _positions(code) -> tuple:
  """`(line, end line, column, end column)` of each instruction of `code`."""
  return tuple(code.co_positions())


@functools.lru_cache(maxsize=512)
def _real_path(filename: str) -> str:
  return os.path.realpath(filename)


def _abstract(tree):
  """Arrays as `ShapeDtypeStruct`s (tracers included), the rest as it is."""
  def leaf(x):
    if is_array(x):
      return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x
  return jax.tree.map(leaf, tree)


class _Recorder:
  """Records creations (through `Module.__post_init__`) and method calls
  (through `nn.intercept_methods`) while a model initialises."""

  def __init__(self):
    self.created: dict[int, Created] = {}
    self.order: list[Created] = []
    #: `(class, method name) -> method` of the methods wrapped to record
    #: their calls (`record_lifted`), to restore.
    self.patched: dict[tuple[type, str], Any] = {}
    self._scanned: set[type] = set()  # the classes `record_lifted` looked through

  def post_init(self, original):
    recorder = self

    def __post_init__(module):
      site = _site(_user_frame(sys._getframe(1)))
      stack = _user_stack(sys._getframe(1))
      result = original(module)  # resolves `parent` (compact modules: the creating module)
      if id(module) not in recorder.created:
        recorder.record(module, site).stack = stack
      recorder.record_lifted(type(module))
      return result

    return __post_init__

  def intercept(self, next_fun, args, kwargs, context):
    record = self.created.get(id(context.module))
    if context.method_name == 'setup':  # Linen's own call, before the first method's
      return self._reserving(record, context.module.scope, lambda: next_fun(*args, **kwargs))
    if record is None:  # a clone Linen made (a transform's), or the model itself
      record = self.record(context.module, None)
    given, named = _inputs_by_position(getattr(type(context.module), context.method_name, None), args, kwargs)
    call = MethodCall(
        context.method_name, _site(_user_frame(sys._getframe(1))), _abstract(given), _abstract(named)
    )
    record.calls.append(call)
    outputs = self._reserving(record, context.module.scope, lambda: next_fun(*args, **kwargs))
    call.outputs = _abstract(outputs)
    return outputs

  @staticmethod
  def _reserving(record: Created | None, scope, run):
    """`run()`, the names it reserved in `scope` added to `record.reserved`."""
    before = set(scope.reservations) if scope is not None else set()
    outputs = run()
    if record is not None and scope is not None:
      record.reserved += [n for n in scope.reservations if n not in before and n not in record.reserved]
    return outputs

  def record_lifted(self, cls: type) -> None:
    """Records the calls of `cls`'s methods that a user decorated with a
    lifted transform (`functools.partial(nn.scan, ...)`): Linen does not
    intercept them (it intercepts the method inside, on a clone, per step)."""
    if cls in self._scanned:  # (it runs at every creation)
      return
    self._scanned.add(cls)
    for klass in cls.__mro__:
      if klass.__module__.startswith('flax.'):
        continue
      for name, method in list(vars(klass).items()):
        # A lifted method wraps the method Linen wraps for its calls
        # (`decorator_lift_transform`); a plain one wraps the user's function.
        if not getattr(getattr(method, '__wrapped__', None), 'method_handler_wrapped', False) \
            or (klass, name) in self.patched or getattr(method, '_kit_recorded', False):
          continue
        self.patched[(klass, name)] = method
        setattr(klass, name, self._recording(method, name))

  def _recording(self, method, name: str):
    """`method` (a lifted one), recording each call of a module the trace
    knows, with its whole inputs."""
    recorder = self

    @functools.wraps(method)
    def recorded(module, *args, **kwargs):
      record = recorder.created.get(id(module))
      if record is None:
        return method(module, *args, **kwargs)
      given, named = _inputs_by_position(method, args, kwargs)
      call = MethodCall(name, _site(_user_frame(sys._getframe(1))), _abstract(given), _abstract(named))
      record.calls.append(call)
      if name not in record.lifted_methods:
        record.lifted_methods += (name,)
      outputs = method(module, *args, **kwargs)
      call.outputs = _abstract(outputs)
      return outputs

    recorded.method_handler_wrapped = True  # Linen does not wrap it again
    recorded._kit_recorded = True
    return recorded

  def restore(self) -> None:
    for (klass, name), method in self.patched.items():
      setattr(klass, name, method)
    self.patched.clear()

  def record(self, module: nn.Module, site: Site | None) -> Created:
    parent = module.parent if isinstance(module.parent, nn.Module) else None
    record = Created(module, site, self.created.get(id(parent)))
    self.created[id(module)] = record
    self.order.append(record)
    if record.parent is not None:
      record.parent.children.append(record)
    return record


def trace(module: nn.Module, *args, rng_streams: tuple[str, ...] = ('params', 'dropout'),
          traced_method: str = '__call__', **kwargs):
  """`(root, variables)`: the record of `module.init(*args, **kwargs)` (its
  root is the model; `traced_method` the method `init` calls, `encode` of a
  class called through its methods) and the abstract variables it made."""
  _real_path.cache_clear()
  recorder = _Recorder()
  original = nn.Module.__post_init__
  nn.Module.__post_init__ = recorder.post_init(original)
  try:
    bound = module.clone(parent=None)
    rebuild, arrays = split_arrays(args, kwargs)

    def init(*arrays):
      call_args, call_kwargs = rebuild(*arrays)
      rngs = {name: jax.random.key(i) for i, name in enumerate(rng_streams)}
      method = None if traced_method == '__call__' else traced_method
      return bound.init(rngs, *call_args, method=method, **call_kwargs)

    with (nn.intercept_methods(recorder.intercept), nothing_sown(), _initializers_under_trace(),
          compat.initializer_draws_as_zeros()):
      variables = jax.eval_shape(init, *arrays)
  finally:
    nn.Module.__post_init__ = original
    recorder.restore()
  roots = [r for r in recorder.order if r.parent is None and r.calls]
  root = next((r for r in roots if type(r.module) is type(module)), None)
  if root is None:
    raise RuntimeError(f'tracing {type(module).__name__}.init recorded no call of the model')
  _run_by_transforms(root, recorder.order)
  _run_on_clones(root, recorder.order)
  return root, variables


#: JAX's initializers (`jax.nn.initializers`, which Flax re-exports), by
#: code: each returns an array of the `shape` and `dtype` it is given (the
#: float default where none is), whatever the key or its configuration. The
#: code is shared by every configuration of a factory (`lecun_normal()`,
#: `normal(0.02)`), so matching it matches them all.
_SHAPE_AND_DTYPE_INITIALIZERS = frozenset(
    f.__code__ for f in (
        jax.nn.initializers.variance_scaling(1.0, 'fan_in', 'normal'),
        jax.nn.initializers.normal(), jax.nn.initializers.truncated_normal(),
        jax.nn.initializers.uniform(), jax.nn.initializers.constant(0.0),
        jax.nn.initializers.zeros, jax.nn.initializers.ones, jax.nn.initializers.orthogonal(),
    )
)


def _abstract_initial_value(init_fn, args, kwargs):
  """What one of `_SHAPE_AND_DTYPE_INITIALIZERS` returns, as zeros of its
  shape and dtype (under `eval_shape` only those are kept), or None where
  its arguments are not `(key, shape, dtype=...)`."""
  try:
    bound = inspect.signature(init_fn).bind(*args, **kwargs)
  except TypeError:
    return None
  bound.apply_defaults()
  shape, dtype = bound.arguments.get('shape'), bound.arguments.get('dtype')
  if shape is None or bound.arguments.get('out_sharding') is not None:
    return None
  return jax.numpy.zeros(shape, dtype)


def _param(scope, name, init_fn, /, *init_args, **init_kwargs):
  """Flax's `Scope.param`, with `init_fn` run as `_initializers_under_trace` says
  in a thread that traces."""
  flax_param = _FLAX_PARAM[0]
  if not _initializers_under_trace.active():
    return flax_param(scope, name, init_fn, *init_args, **init_kwargs)

  @functools.wraps(init_fn)
  def inline(*args, **kwargs):
    if getattr(init_fn, '__code__', None) in _SHAPE_AND_DTYPE_INITIALIZERS:
      value = _abstract_initial_value(init_fn, args, kwargs)
      if value is not None:
        return value
    try:
      with jax.disable_jit():
        return init_fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - refused inline: run as Flax runs it
      return init_fn(*args, **kwargs)
  return flax_param(scope, name, inline, *init_args, **init_kwargs)


_FLAX_PARAM = [None]  # Flax's `Scope.param`, as it was when the patch went in


def _patch_param() -> None:
  _FLAX_PARAM[0] = flax_scope.Scope.param
  flax_scope.Scope.param = _param


def _restore_param() -> None:
  flax_scope.Scope.param = _FLAX_PARAM[0]


_initializers_under_trace = compat.ThreadScopedPatch(_patch_param, _restore_param)
"""Parameter initializers as `trace` runs them, in the threads inside it.

Under `eval_shape` an initial value has a shape and a dtype only, and a
port's traces make initial values by the hundred (every layer, at every
symbolic configuration tried). JAX's own initializers
(`_SHAPE_AND_DTYPE_INITIALIZERS`) give zeros of their shape and dtype:
drawing `truncated_normal` at symbolic sizes is a third of a trace, and
its values are never read; where a wrapper calls them (`nn.with_partitioning`,
`DenseGeneral`'s reshaping), their draws give zeros
(`compat.initializer_draws_as_zeros`). Others (a user's) run with `jax.disable_jit()`:
jitted, each is traced into a jaxpr of its own at every new shape; inline,
its operations are traced once, into the model's. An initializer creates
no module and calls none, so the record is the same. One that inline
control flow refuses (a scan over a symbolic or zero length: `disable_jit`
unrolls it) runs jitted again, as it would have run, so no symbol is
refused that was taken before.

`Scope.param` is Flax's, patched while any thread traces
(`compat.ThreadScopedPatch`: counted, so traces in two threads restore it
once both end); other threads' calls go to Flax's own.
"""


def is_transformed(cls: type) -> bool:
  """Whether `cls` is a class Linen's lifted transforms made (`nn.scan(Block)`)."""
  return cls.__module__ == 'flax.linen.transforms' and cls.__name__ != 'Module'


def transformed_class(cls: type) -> type:
  """The user's class a transform-made class wraps (`Block` of `ScanCheckpointBlock`)."""
  return next(c for c in cls.__mro__ if not is_transformed(c))


def _run_by_transforms(root: Created, order: list[Created]) -> None:
  """Each module a transform made, as the user's module the transform ran:
  Linen records its calls and submodules on clones that the transform binds
  under the same path (`ScanCheckpointBlock_0`), not on the module itself."""
  for record in list(root.walk()):
    if not is_transformed(record.cls) or record.calls and record.children:
      continue
    user = transformed_class(record.cls)
    body = next((r for r in order if r.parent is None and type(r.module) is user
                 and r.path == record.path and r.calls), None)
    if body is None:
      continue
    record.transform = record.cls
    record.module, record.calls, record.children = body.module, body.calls, body.children
    for child in record.children:
      child.parent = record
    _run_by_transforms(record, order)


def _run_on_clones(root: Created, order: list[Created]) -> None:
  """The submodules a method decorated with a lifted transform created, as
  the module's own: Linen runs such a method on a clone of the module bound
  under the same path (per step, for `nn.scan`), and creates them there."""
  for record in list(root.walk()):
    if not record.lifted_methods:
      continue
    # Its `__call__`'s calls first, as for any module (a parent asked it for
    # `initialize_carry` before calling it).
    record.calls.sort(key=lambda c: c.method != '__call__')
    if record.children:
      continue
    clone = next((r for r in order if r.parent is None and r is not record and type(r.module) is record.cls
                  and r.path == record.path and any(c.method in record.lifted_methods for c in r.calls)), None)
    if clone is None:
      continue
    record.children = clone.children
    for child in record.children:
      child.parent = record
