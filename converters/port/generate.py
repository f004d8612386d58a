"""`port(linen_model)`: the NNX port of a Linen model, written and proven.

The model is traced (`tracing`), each of the user's classes it uses is
written as an NNX class from its source, innermost first (`class_writing`:
`compact` or `setup_style`, with the sizes Linen infers from `shapes`), what
cannot be written becomes a marked stub, and the file is assembled with its
path mapping (`emit`): `write`. Then `port` writes the file, imports it and
proves it (`prove`) unless it holds a stub.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
import types

import jax
from flax import linen as nn

from converters.linen_model import LinenModel
from converters.paths import PathMapping, format_path
from converters.port import class_writing, classes, constructor, emit, layers, prove, shapes, source, switches, tracing
from converters.port.branches import taken_by
from converters.port.errors import PortInputError, PortOutputError
from converters.port.stubs import Stub, StubPort, UnportedBranch


@dataclasses.dataclass(frozen=True)
class DecodingPair:
  """A flag that makes a cache (`decode`) flipped together with another
  flag that changes what is built (`scan_layers`): the scanned layers'
  caches, which `write` maps and `port` proves. `model` is None where
  Linen does not build the two together; else `root` and `variables` are
  its trace (`tracing.trace`)."""

  description: str
  model: LinenModel | None
  root: tracing.Created | None = None
  variables: dict | None = None


@dataclasses.dataclass
class PortResult:
  """What `port` wrote and found.

  Attributes:
    text: the generated port module (Flax, JAX and the user's imports only).
    paths_text: the module of its mapping, `PATHS` (`prove.paths_file`).
    classes: the classes written (stubs included), innermost first.
    stubs: the classes written as stubs, with why.
    modes: the call flags (and fields) the model's port takes as its mode,
      with their value in training (`{'train': True}`).
    checks: `(check, outcome, figure)` rows: the proof, ruff, timings.
    proven: whether the proof held (False with stubs: nothing was run).
    branches: the branches of written classes no traced configuration
      took, or only configurations the proof adds took and the port cannot
      write, written to raise (the proof holds for the rest).
    left_out: those configurations (their descriptions) and why: neither
      mapped nor proven.
  """

  text: str
  classes: list[str]
  stubs: list[Stub]
  modes: dict[str, bool]
  paths_text: str = ''
  checks: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  proven: bool = False
  failure: str | None = None
  sources: list[str] = dataclasses.field(default_factory=list)
  #: The model with one flag of its configuration flipped, `(model, what,
  #: its abstract variables)`.
  flags: list = dataclasses.field(default_factory=list)
  #: The traced model's abstract variables.
  variables: dict = dataclasses.field(default_factory=dict)
  branches: list[UnportedBranch] = dataclasses.field(default_factory=list)
  #: Input sizes of the model the code ties to a field (`inputs - y`, y of
  #: `channels` features), which the port takes to be that field: proven
  #: with inputs so (`shapes.SymbolicTrace.ties`).
  ties: dict = dataclasses.field(default_factory=dict)
  #: The Linen classes written, in the order of `classes`.
  linen_classes: list = dataclasses.field(default_factory=list)
  #: The flags whose flip Linen does not build (`decode=True` of a scan
  #: that carries no cache), and the fields left None it does not build
  #: (`features=None`): the code they switch on is not proven.
  refused_flags: list = dataclasses.field(default_factory=list)
  #: The other configurations (flags flipped, fields given a value) that
  #: make nothing the traced one does not (`use_bias=False`): nothing new
  #: to write, proven with the written branches together, `(model, what)`.
  within: list = dataclasses.field(default_factory=list)
  #: The Flax layer classes the traced model makes (`nn.Dense`, ...): what
  #: the report says of the layers NNX computes otherwise.
  flax_layers: frozenset = frozenset()
  left_out: dict[str, str] = dataclasses.field(default_factory=dict)
  #: The written `PATHS`.
  mapping: PathMapping | None = None
  #: The fields left None given a value, the string fields switched, the
  #: fields set where their default is None left None: `(model, description)`.
  optional: list = dataclasses.field(default_factory=list)
  #: `(field, why)` of the fields that cannot be so.
  unproven: list = dataclasses.field(default_factory=list)
  #: Each flag that makes a cache with each other flag.
  decoding_pairs: list[DecodingPair] = dataclasses.field(default_factory=list)


def _made(root: tracing.Created) -> set:
  """What a traced model makes: `(class, site, transform)` of each module."""
  return {(c.cls, c.site, c.transform) for c in root.walk()}


def _shapes(variables) -> set:
  """`(path, shape)` of every variable."""
  return {(jax.tree_util.keystr(p), tuple(getattr(x, 'shape', ()))) for p, x in
          jax.tree_util.tree_flatten_with_path(variables)[0]}


def _making_more(configurations, variables, made: set, sizes: bool = True, kinds: tuple | None = None
                 ) -> tuple[list, list]:
  """`configurations` traced: `(flags, within)`, those that make a module
  where the model makes none (or, with `sizes`, a variable of another size,
  stop a cache, make fewer modules, or hold None or a flag where the model
  holds an integer, `kinds`: `shapes.size_kinds`) as `(model, description,
  root, variables)`, and the rest as `(model, description)`."""
  flags, within = [], []
  for other, description in configurations:
    other_root, other_variables = tracing.trace(other.module, *other.args, **other.kwargs)
    stops_decoding = 'cache' in variables and 'cache' not in other_variables
    sites = _made(other_root)
    # Another branch on the sizes, though its shapes may be the model's
    # (`rep_size=False` makes no `pre_logits`; `mlp_dim=None` where 4 * d is mlp_dim).
    other_branch = sites < made or kinds is not None and shapes.size_kinds(other.module) != kinds
    if not sites <= made or sizes and (stops_decoding or other_branch
                                       or not _shapes(other_variables) <= _shapes(variables)):
      flags.append((other, description, other_root, other_variables))
    else:
      within.append((other, description))  # nothing made or sized that the model does not
  return flags, within


@dataclasses.dataclass(frozen=True)
class _Configurations:
  """The model's other configurations that `write` writes the classes for.

  Attributes:
    flags: those making what the traced one does not (a flag flipped, a
      field given a value), `(model, description, root, variables)`.
    within: the rest, making nothing new (`use_bias=False`), `(model,
      description)`.
    optional: the fields left None given a value, the string fields
      switched, the fields set where their default is None left None,
      `(model, description)`.
    unproven: `(field, why)` of those that cannot be so.
    refused: the descriptions of the flags' flips and fields left None
      that Linen does not build.
  """

  flags: list
  within: list
  optional: list
  unproven: list
  refused: list[str]


def _trace_model(linen_model: LinenModel) -> tuple[tracing.Created, dict]:
  """The traced model, `(root, variables)`; else why it cannot be ported."""
  module = linen_model.module
  if (spec := layers.layer_spec(type(module))) is not None:
    raise PortInputError(
        f'the model is {type(module).__name__}, {"a subclass of " if spec.subclass else ""}Flax\'s '
        f'{spec.linen.__mro__[1 if spec.subclass else 0].__name__}: port a model that creates it (its port is '
        f'written with that model\'s)' if spec.subclass else f'the model is Flax\'s {type(module).__name__}: '
        f'use {spec.nnx} itself')
  failed = _FailedLayer()
  try:
    with nn.intercept_methods(failed):
      return tracing.trace(module, *linen_model.args, **linen_model.kwargs)
  except Exception as e:  # noqa: BLE001 - the user's model: any error of its own
    layer = failed.layer if failed.error is e else None
    # JAX's NameError for an axis no transform binds, raised in a Flax layer
    # that reduces over one (a LayerNorm's `axis_name`), not in the user's code.
    unbound = (isinstance(e, NameError) and _raised_in_flax(e)
               and getattr(layer, 'axis_name', None) is not None)
    raise PortInputError(
        f'{type(module).__name__}.init on the example inputs failed: {type(e).__name__}: '
        f'{str(e).splitlines()[0] if str(e) else ""}'
        + (f'; {type(layer).__name__}(axis_name={layer.axis_name!r}) reduces over a mapped axis in every '
           'call, which the port traces without: port it by hand' if unbound else '')
    ) from e


class _FailedLayer:
  """A method interceptor keeping the innermost Linen module the latest
  exception left (`error`, `layer`): one the user's code caught is replaced
  by the next."""

  def __init__(self):
    self.error: BaseException | None = None
    self.layer: nn.Module | None = None

  def __call__(self, next_fun, args, kwargs, context):
    try:
      return next_fun(*args, **kwargs)
    except Exception as e:
      if self.error is not e:
        self.error, self.layer = e, context.module
      raise


def _raised_in_flax(e: BaseException) -> bool:
  """Whether `e` was raised in Flax's code, or in JAX's called from it: the
  innermost frame not JAX's own is Flax's (JAX filters its own frames out of
  tracebacks unless told not to, `JAX_TRACEBACK_FILTERING=off`)."""
  modules = []
  tb = e.__traceback__
  while tb is not None:
    modules.append(tb.tb_frame.f_globals.get('__name__', ''))
    tb = tb.tb_next
  while modules and modules[-1].startswith(('jax.', 'jaxlib.')):
    modules.pop()
  return bool(modules) and modules[-1].startswith('flax.')


def _configurations(linen_model: LinenModel, root: tracing.Created, variables) -> _Configurations:
  """The other configurations of the traced model (`root`, `variables`)
  whose branches the classes are written for, traced."""
  refused: list[str] = []
  # Each field left None given a value, as a flag flipped: the branch it
  # takes is traced, written and mapped too (a learned position table).
  optional, unproven = prove.optional_configurations(linen_model)
  # Each string or enum field at every other value the source switches on.
  switched, unswitched = prove.switched_configurations(linen_model, {c.cls for c in root.walk()})
  # Each field set where its default is None, left None (`mlp_dim or 4 * d`).
  defaults, unbuilt = prove.default_configurations(linen_model)
  optional, unproven = [*optional, *switched, *defaults], [*unproven, *unswitched]
  # The code each flag of the configuration switches on (`scan_layers`):
  # its modules are instances of the classes too, written with the rest.
  flags, within = _making_more([*prove.flag_configurations(linen_model, refused), *optional], variables,
                               _made(root), kinds=shapes.size_kinds(linen_model.module))
  return _Configurations(flags, within, optional, unproven, [*refused, *(d for d, _ in unbuilt)])


def _add_instances(instances: dict, origins: dict[int, str], flags) -> None:
  """The instances each of `flags` makes (`_Configurations.flags`), added to
  their class's `instances`, with their configuration's description in
  `origins` (by `id`)."""
  for _, description, other_root, _ in flags:
    for instance in other_root.walk():
      instances.setdefault(instance.cls, []).append(instance)
      origins[id(instance)] = description


def _write_classes(linen_model: LinenModel, root: tracing.Created, variables, flags
                   ) -> tuple[class_writing.ClassesWritten, list]:
  """The user's classes under `root`, written from the model's instances
  and those of `flags` (`_Configurations.flags`), and the flags they are
  written for: where a class makes a module no configuration traced so far
  went (a loop the model's runs no times), written again with the first
  other configuration the proof tries that goes there, that one added to
  the flags; those a class is not written for (a branch only they take
  raises) left out, neither mapped nor proven (the report says so)."""
  instances: dict[type, list[tracing.Created]] = {}
  for instance in root.walk():
    instances.setdefault(instance.cls, []).append(instance)
  origins: dict[int, str] = {}  # the configuration that made an instance, by id
  _add_instances(instances, origins, flags)
  symbolic: dict = {}  # (the instances stay alive in `instances`: their ids stay theirs)
  written = class_writing.write_classes(root, instances, variables, symbolic, origins)
  if written.untraced:
    made = _made(root).union(*(_made(other_root) for _, _, other_root, _ in flags))
    more, _ = _making_more(prove.other_configurations(linen_model, most=2), variables, made, sizes=False)
    more = more[:1]  # (the other one mostly goes where it goes: its symbolic traces, twice the time)
    if more:
      flags = [*flags, *more]
      _add_instances(instances, origins, more)
      written = class_writing.write_classes(root, instances, variables, symbolic, origins)
  return written, [f for f in flags if f[1] not in written.left_out]


def _decoding_pairs(linen_model: LinenModel, flags) -> list[DecodingPair]:
  """Each of `flags` (`_Configurations.flags`) that makes a cache, with
  each other flag: built together by Linen, and traced."""
  pairs = []
  for decoder, decode_change, _, decoder_variables in flags:
    for other, change, *_ in flags if 'cache' in decoder_variables else ():
      if other is decoder:
        continue
      description = f'{decode_change}, {change}'
      both = prove.combined(linen_model, decoder, other)
      if both is None:
        pairs.append(DecodingPair(description, None))
      else:
        pairs.append(DecodingPair(description, both, *tracing.trace(both.module, *both.args, **both.kwargs)))
  return pairs


def _mapping(root: tracing.Created, variables, ports: dict, flags, decoding_pairs: list[DecodingPair]
             ) -> PathMapping:
  """The written `PATHS`: the traced model's variables, and those of every
  flag's configuration (the scanned layers') and decoding pair's (the
  scanned layers' caches) where they do not contradict the traced
  configuration's and it takes no branch written to raise; none under a
  stub, whose port is not written (`emit.under_stubs`)."""
  pairs = emit.path_pairs(root, variables, ports)
  traced = [(other_root, other_variables) for _, _, other_root, other_variables in flags]
  traced += [(pair.root, pair.variables) for pair in decoding_pairs
             if pair.model is not None and not _takes_a_raised_branch(pair.root, ports)]
  for other_root, other_variables in traced:
    known = {linen: nnx_path for linen, nnx_path, *_ in pairs}
    held = {nnx_path: linen for linen, nnx_path, *_ in pairs}
    more = emit.path_pairs(other_root, other_variables, ports)
    if all(known.get(linen, nnx_path) == nnx_path and held.get(nnx_path, linen) == linen
           for linen, nnx_path, *_ in more):
      pairs += [p for p in more if p[0] not in known]
  return emit.mapping_of(pairs)


def write(linen_model: LinenModel, *, factory: str = '', module_name: str = 'models_nnx',
          test_name: str = '') -> tuple[PortResult, dict]:
  """The generated file for `linen_model`, not yet proven, and the ports of
  its classes (stubs' included), by Linen class."""
  module = linen_model.module
  root, variables = _trace_model(linen_model)
  configurations = _configurations(linen_model, root, variables)
  classes_written, flags = _write_classes(linen_model, root, variables, configurations.flags)
  ports, written = classes_written.ports, classes_written.written
  decoding_pairs = _decoding_pairs(linen_model, flags)
  mapping = _mapping(root, variables, ports, flags, decoding_pairs)
  # The model's mode: its call's flags and its fields that the mode replaced.
  modes = {**ports[type(module)].modes, **ports[type(module)].field_modes}
  generated = emit.write_file(
      written, mapping, factory=factory, module_name=module_name, test_name=test_name, modes=modes,
      unmapped=emit.under_stubs(root, variables, ports),
  )
  files = {source.file_of(c).path for c in [type(module), *ports, *(s[0] for s in written if isinstance(s, tuple))]}
  root_port = ports.get(type(module))
  result = PortResult(
      generated.text, generated.classes, classes_written.stubs, dict(modes), generated.paths_text,
      sources=sorted(files),
      flags=[(other, description, other_variables) for other, description, _, other_variables in flags],
      variables=variables,
      branches=classes_written.branches,
      ties=dict(root_port.ties) if isinstance(root_port, classes.ClassPort) else {},
      linen_classes=[w.cls if isinstance(w, classes.ClassPort) else w[0] for w in written],
      refused_flags=configurations.refused,
      within=configurations.within,
      flax_layers=frozenset(i.cls for i in root.walk() if layers.is_flax_class(i.cls)),
      left_out=dict(classes_written.left_out),
      mapping=mapping,
      optional=configurations.optional,
      unproven=configurations.unproven,
      decoding_pairs=decoding_pairs,
  )
  return result, ports


def tolerance_checks(flax_layers, atol: float) -> list[tuple[str, str, str]]:
  """The report's rows for a proof within `atol` (0: bit for bit), by the
  Flax layers the model makes that NNX computes otherwise."""
  if not atol:
    return []
  made = lambda linen_class: any(issubclass(c, linen_class) for c in flax_layers)
  rows = []
  if made(nn.MultiHeadDotProductAttention):
    rows.append((
        "nnx.MultiHeadAttention's fused attention (no dropout: jax.nn.dot_product_attention)",
        f'within {atol:g}', "bit for bit with Linen's attention function in its place",
    ))
  if made(nn.OptimizedLSTMCell):
    rows.append((
        "nnx.OptimizedLSTMCell's gates, held side by side (gradients summed in XLA's order)",
        f'within {atol}', 'Linen concatenates the gate kernels inside its program',
    ))
  return rows


def _prove_around_stubs(linen_model: LinenModel, out: str, result: PortResult, ports) -> None:
  """Each written class with no stub below it, proven on its own where the
  model first calls it (its traced inputs, its configuration), with the
  mapping written for it; none inside another proven so. The model itself,
  holding a stub, is not proven (`result.proven` stays False)."""
  root, _ = tracing.trace(linen_model.module, *linen_model.args, **linen_model.kwargs)
  holds_stub: dict[int, bool] = {}

  def stubbed(instance) -> bool:
    if id(instance) not in holds_stub:
      holds_stub[id(instance)] = isinstance(ports.get(instance.cls), StubPort) or any(
          [stubbed(c) for c in instance.children])
    return holds_stub[id(instance)]

  chosen, seen = [], set()

  def visit(instance):
    if not stubbed(instance):
      # (A class called through other methods, `Embedder.encode`, is proven
      # with the classes that call it.)
      if instance.cls in ports and instance.cls not in seen and instance.calls and (
          instance.calls[0].method == '__call__'):
        seen.add(instance.cls)
        chosen.append(instance)
      return
    for child in instance.children:
      visit(child)

  visit(root)
  if not chosen:
    return
  generated = prove.import_file(out)
  for instance in chosen:
    start = time.perf_counter()
    name = instance.cls.__name__
    try:
      call = instance.calls[0]
      alone = LinenModel(instance.module.clone(parent=None, name=None), *call.args, **call.kwargs)
      alone_root, alone_variables = tracing.trace(alone.module, *alone.args, **alone.kwargs)
      if not jax.tree.leaves(alone_variables):
        result.checks.append((f'{name} alone, around the stubs', 'no variables to map: not checked on its own',
                              'not checked'))
        continue
      paths = emit.mapping_of(emit.path_pairs(alone_root, alone_variables, ports))
      port_of = ports[instance.cls]
      prove.assert_generated_port(alone, generated, modes={**port_of.modes}, paths=paths)
    except Exception as e:  # noqa: BLE001 - a failed proof is the result, reported
      why = ''.join(traceback.format_exception_only(e)).strip().splitlines()[0]
      result.checks.append((f'{name} alone, around the stubs', f'FAILED: {why}',
                            f'{time.perf_counter() - start:.2f} s'))
      continue
    result.checks.append((f'{name} alone, around the stubs (as {format_path(instance.path)}, traced '
                          'configuration)', 'passed', f'{time.perf_counter() - start:.2f} s'))


def _import_name(out: str) -> str:
  """How the written module is imported from the directory the command runs in
  (`ports.models_nnx` for `ports/models_nnx.py`), else its file's own name."""
  stem = os.path.splitext(out)[0]
  parts = os.path.relpath(os.path.realpath(stem), os.path.realpath(os.getcwd())).split(os.sep)
  if parts[0] != os.pardir and all(part.isidentifier() for part in parts):
    return '.'.join(parts)
  return os.path.basename(stem)


def port(linen_model: LinenModel, out: str, *, factory: str = '', test_out: str | None = None) -> PortResult:
  """Writes the port of `linen_model` to `out` (and its test to `test_out`),
  then proves it. `factory` is how the test file gets the Linen model
  (`pkg.module:function`)."""
  start = time.perf_counter()
  for path in (out, test_out):
    parent = os.path.dirname(os.path.abspath(path)) if path is not None else None
    if parent is not None and not os.path.isdir(parent):
      raise PortOutputError(f'{path}: the directory {parent} does not exist; create it first')
  module_name = _import_name(out)
  test_name = os.path.basename(test_out) if test_out else ''
  result, ports = write(linen_model, factory=factory, module_name=module_name, test_name=test_name)
  problems = _write_files(result, ports, out, factory, test_out, start)
  if result.stubs:
    _prove_around_stubs(linen_model, out, result, ports)
    return result
  generated = _prove_traced(linen_model, out, result)
  if generated is not None and _prove_other_configurations(linen_model, generated, result, ports):
    result.proven = not problems
  return result


def _write_files(result: PortResult, ports: dict, out: str, factory: str, test_out: str | None,
                 start: float) -> list[str]:
  """Writes the port to `out` and its `PATHS` beside it, ruff's safe fixes
  made (`result.text` as fixed), and its test to `test_out` where given;
  the report's rows of what was written since `start`; ruff's findings."""
  paths_out = prove.paths_file(out)
  for path in (out, paths_out, test_out):
    if path is not None and os.path.realpath(path) in result.sources:
      raise PortOutputError(f'{path} is a file the model is read from; write the port elsewhere')
  emit.write_text(out, result.text)
  emit.write_text(paths_out, result.paths_text)
  problems, kept = emit.ruff_check(out, result.sources)
  problems += emit.ruff_check(paths_out)[0]
  with open(out, encoding='utf-8') as f:
    result.text = f.read()
  result.checks.append(('generated', f'{len(result.classes)} classes, {len(result.stubs)} stubs',
                        f'{time.perf_counter() - start:.2f} s'))
  result.checks.append(('ruff check', 'passed' if not problems else '; '.join(problems), ''))
  if kept:
    result.checks.append(('ruff check, in code kept from the Linen source', '; '.join(kept), ''))
  result.checks += _dtype_parameter_checks(ports)
  if test_out is not None:
    decoding = any('cache' in v for _, _, v in result.flags)
    emit.write_text(test_out, test_file(factory, out, result.modes, decoding=decoding,
                                        decodes_only='cache' in result.variables))
  return problems


def _dtype_parameter_checks(ports: dict) -> list[tuple[str, str, str]]:
  """The report's rows of the constructors' dtype keywords: Linen made a
  variable in the dtype of a value of the call; NNX, which builds before
  any call, takes it as a keyword of the constructor."""
  return [
      (f'{written.cls.__name__}({p.name}=...)', f'{p.default} unless given',
       f'Linen makes its variables in the dtype of {p.name.removesuffix("_dtype")} at the '
       'call: give that dtype where it is not the traced one')
      for written in ports.values() if isinstance(written, classes.ClassPort)
      for p in written.constructor.of_kind(constructor.ParameterKind.DTYPE)
  ]


def _prove_traced(linen_model: LinenModel, out: str, result: PortResult) -> types.ModuleType | None:
  """The port at `out` imported and proven at the traced configuration:
  the imported module, or None where the proof failed (`result.failure`)."""
  start = time.perf_counter()
  try:
    generated = prove.import_file(out)
    prove_one = prove.assert_generated_decoding if 'cache' in result.variables else prove.assert_generated_port
    atol = prove_one(linen_model, generated, modes=result.modes)
  except Exception as e:  # noqa: BLE001 - a failed proof is the result, reported
    result.failure = ''.join(traceback.format_exception_only(e)).strip()
    result.checks.append(('assert_port_equivalent', 'FAILED', f'{time.perf_counter() - start:.2f} s'))
    return None
  result.checks.append(('assert_port_equivalent', 'passed', f'{time.perf_counter() - start:.2f} s'))
  result.checks += tolerance_checks(result.flax_layers, atol)
  return generated


def _prove_other_configurations(linen_model: LinenModel, generated: types.ModuleType, result: PortResult,
                                ports: dict) -> bool:
  """The classes are written for any configuration: proven at others too,
  with the mapping the writer gives for them (the traced one's may name
  layers by a count that changed). Whether every proof held (else
  `result.failure` says where)."""
  for tie in prove.tie_descriptions(result.ties):
    result.checks.append(('assumed of the inputs (the code ties them)', tie, 'proven with inputs so'))
  others = prove.other_configurations(linen_model, most=2, ties=result.ties)
  if not others:
    # Nothing shows the sizes are not the traced numbers: not handed over as proven.
    result.failure = ('no other configuration of the model builds in Linen (every integer one more, '
                      'doubled, tuples longer, inputs wider), so the sizes the port writes are '
                      'proven at the traced one only; check them by hand')
    result.checks.append(('another configuration', 'NOT PROVEN', 'none builds'))
    return False
  result.checks += _unproven_checks(result)
  decoding_proven = 'cache' in result.variables
  for other, changes, traced in _configurations_to_prove(linen_model, result, ports, others):
    decodes = _prove_at(other, changes, traced, generated, result, ports, decoding_proven=decoding_proven)
    if decodes is None:
      return False
    decoding_proven |= decodes
  return True


def _unproven_checks(result: PortResult) -> list[tuple[str, str, str]]:
  """The report's rows of the configurations not proven: those Linen does
  not build, the fields that cannot be given a value (the branch the
  traced configuration skipped), those a class is not written for."""
  not_built = [pair.description for pair in result.decoding_pairs if pair.model is None] + result.refused_flags
  return [
      *((f'another configuration ({description})', 'not built by Linen', 'not proven') for description in not_built),
      *((f'another configuration ({name} given a value)', why, 'not proven') for name, why in result.unproven),
      *((f'another configuration ({description})', 'raises NotImplementedError', f'not proven: {why}')
        for description, why in result.left_out.items()),
  ]


def _configurations_to_prove(linen_model: LinenModel, result: PortResult, ports: dict, others: list) -> list:
  """`(model, description, trace or None)` of each configuration the port
  is proven at besides the traced one: `others` (`prove.other_configurations`),
  the flags, the decoding pairs (traced by `write`), the call's flags the port
  keeps as arguments, the fields given a value, and floats moved."""
  written = {d for _, d, _ in result.flags} | set(result.left_out)  # proven with the flags, or not written
  optional = [(o, d) for o, d in result.optional if d not in written]
  # A flag of the call the port keeps as an argument (not its mode: it does
  # more than set layers' modes, `if deterministic: return ids`), turned
  # round: both sides called with it.
  calls = [
      (LinenModel(linen_model.module, *linen_model.args, **{**linen_model.kwargs, k: not v}),
       f'{k}={not v}, a flag of the call')
      for k, v in linen_model.kwargs.items() if isinstance(v, bool) and k not in result.modes
  ]
  # Floats moved, tuples the sources loop over emptied.
  looped = switches.looped_over(switches.source_paths(result.linen_classes))
  moved = prove.moved_configurations(linen_model, looped)
  # The branches the flags and given values wrote, taken together with the
  # flags that make nothing new (`use_bias=False`), with floats moved and
  # tuples emptied: each branch and flag proven beyond the traced sizes.
  within = [(o, d) for o, d in result.within if d not in written]
  joined = [*((o, d) for o, d, v in result.flags if 'cache' not in v), *optional, *within]
  branches, taken = _combined(linen_model, joined)
  if taken and _takes_a_raised_branch(branches, ports):
    # Flags that together take a branch written to raise (`if extra and
    # deep:`, each alone taking none): joined one by one, each kept only
    # where the join stays out of such branches.
    branches, taken = _combined(linen_model, joined, lambda model: not _takes_a_raised_branch(model, ports))
  tried = {d for _, d in others}  # (a configuration written from for a loop it runs: proven once)
  flags = [(o, d) for o, d, _ in result.flags if d not in tried]
  if taken:  # one proof: floats moved and tuples emptied (the sizes a branch reads off a loop)
    alone = len(taken) == 1 and taken[0] in tried | {d for _, d in [*flags, *optional]}  # proven as it is
    moved += [(o, f'{", ".join(taken)}; {d}') for o, d in prove.moved_configurations(branches, looped)[:1]] or (
        [] if alone else [(branches, ', '.join(taken))])  # (no float or tuple to move: the flags alone)
  pairs = [(pair.model, pair.description, (pair.root, pair.variables))
           for pair in result.decoding_pairs if pair.model is not None]
  return [*((o, d, None) for o, d in [*others, *flags]), *pairs,
          *((o, d, None) for o, d in [*calls, *optional, *moved])]


def _prove_at(other: LinenModel, changes: str, traced: tuple | None, generated: types.ModuleType,
              result: PortResult, ports: dict, *, decoding_proven: bool) -> bool | None:
  """The port proven at the configuration `other` (`changes` describes it;
  `traced`: its `(root, variables)` where traced already), through the
  written `PATHS` where they map its variables: whether it decodes; None
  where the proof failed or `PATHS` does not map it (`result.failure`
  says which). `decoding_proven`: whether a decoding configuration was."""
  start = time.perf_counter()
  try:
    root, variables = traced if traced is not None else tracing.trace(other.module, *other.args, **other.kwargs)
    pairs = emit.path_pairs(root, variables, ports)
    # Through the written PATHS where they map this configuration's
    # variables as its classes hold them; else through its own mapping,
    # and the port is not proven.
    uncovered = emit.unmapped_pairs(result.mapping, pairs)
    paths = result.mapping if not uncovered else emit.mapping_of(pairs)
    prove_one = prove.assert_generated_decoding if 'cache' in variables else prove.assert_generated_port
    # The fused attention as written is checked by the first proof (and
    # decoding's first): its rounding is the kernel's, not the sizes'.
    as_written = 'cache' in variables and not decoding_proven
    prove_one(other, generated, modes=result.modes, paths=paths, as_written=as_written)
  except Exception as e:  # noqa: BLE001 - a failed proof is the result, reported
    result.failure = f'at {changes}: ' + ''.join(traceback.format_exception_only(e)).strip()
    result.checks.append((f'another configuration ({changes})', 'FAILED',
                          f'{time.perf_counter() - start:.2f} s'))
    return None
  result.checks.append((f'another configuration ({changes})', 'passed',
                        f'{time.perf_counter() - start:.2f} s'))
  if uncovered:
    # The classes hold there, the written PATHS does not: a checkpoint of
    # that configuration would not convert. Not handed over as proven.
    shown = ', '.join(f'{format_path(linen)} -> {format_path(nnx_path)}' for linen, nnx_path in uncovered[:3]) + (
        ', ...' if len(uncovered) > 3 else '')
    result.checks.append((f'PATHS at that configuration ({changes})', 'NOT COVERED', f'it needs {shown}'))
    result.failure = (
        f'at {changes}: the classes are proven, but PATHS does not map that configuration\'s '
        f'variables ({shown}): Linen numbers these layers otherwise than any rule of PATHS '
        '(a layer of the same class made before a loop, or between two loops); for such a '
        'checkpoint, give PATHS + [the rules above] or --paths infer'
    )
    return None
  return 'cache' in variables


def _combined(linen_model: LinenModel, configurations, keeps=lambda model: True) -> tuple[LinenModel, list[str]]:
  """The model with the changes of each of `configurations` (`(model,
  description)`) that Linen builds together with those before it (and
  that `keeps`), and the descriptions of those joined."""
  joined, taken = linen_model, []
  for other, change in configurations:
    if (both := prove.combined(linen_model, joined, other)) is not None and keeps(both):
      joined, taken = both, [*taken, change]
  return joined, taken


def _takes_a_raised_branch(model: LinenModel | tracing.Created, ports) -> bool:
  """Whether an instance of the model (traced, or as `tracing.trace`
  gives its root) takes a branch its class's port writes to raise
  (`ClassPort.untraced_branches`)."""
  root = model if isinstance(model, tracing.Created) else tracing.trace(model.module, *model.args, **model.kwargs)[0]
  for instance in root.walk():
    port = ports.get(instance.cls)
    if isinstance(port, classes.ClassPort) and any(taken_by(b, port.file, instance) for b in port.untraced_branches):
      return True
  return False


def test_file(factory: str, out: str, modes: dict[str, bool], *, decoding: bool = False,
              decodes_only: bool = False) -> str:
  """The pytest file repeating the proof in the user's CI, and showing that
  a checkpoint of the Linen model converts for the port (`linen-nnx
  convert --paths <port>_paths:PATHS`) and training goes on alike. `decoding`:
  the model or a configuration of it decodes, proven too; `decodes_only`:
  the model as given decodes (its every call is a decoding step)."""
  module, _, function = factory.partition(':')
  names = ['import_file']
  tests = []
  names.append('assert_generated_port')
  if not decodes_only:
    tests.append(
        f'def test_port_is_equivalent():\n'
        f'  assert_generated_port({function}(), import_file(PORT), modes={modes!r})\n'
    )
  else:
    names.append('configurations_without_decoding')
    tests.append(
        f'def test_port_without_decoding_is_equivalent():\n'
        f'  generated = import_file(PORT)\n'
        f'  for model, _ in configurations_without_decoding({function}()):\n'
        f'    assert_generated_port(model, generated, modes={modes!r})\n'
    )
  if not decodes_only:
    names.append('assert_checkpoint_trains_on')
    tests.append(
        f'def test_a_linen_checkpoint_converts_and_training_goes_on(tmp_path):\n'
        f'  assert_checkpoint_trains_on({function}(), PORT, str(tmp_path), factory={factory!r}, modes={modes!r})\n'
    )
  if decoding or decodes_only:
    names += ['assert_generated_decoding', 'decoding_configurations']
    tests.append(
        f'def test_port_decodes_as_linen_does():\n'
        f'  generated = import_file(PORT)\n'
        f'  for model, _ in decoding_configurations({function}()):\n'
        f'    assert_generated_decoding(model, generated, modes={modes!r})\n'
    )
  return (
      f'"""The NNX port in `{os.path.basename(out)}` is its Linen original: written by `linen-nnx port`."""\n\n'
      'import os\n\n'
      f'from {module} import {function}\n\n'
      f'from converters.port import {", ".join(sorted(names))}\n\n'
      f'PORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), {os.path.basename(out)!r})\n\n\n'
      + '\n\n'.join(tests)
  )
