"""`port(linen_model)`: the NNX port of a Linen model, written and proven.

The model is traced (`tracing`), each of the user's classes it uses is
written as an NNX class from its source, innermost first (`compact` or
`setup_style`, with the sizes Linen infers from `shapes`), what cannot be written becomes a
marked stub, and the file is assembled with its path mapping (`emit`). Then
the file is imported and proven (`prove`) unless it holds a stub.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
import traceback

import jax
from flax import linen as nn

from converters.linen_model import LinenModel
from converters.paths import format_path
from converters.port import (
  classes,
  compact,
  emit,
  layer_subclasses,
  layers,
  prove,
  setup_style,
  shapes,
  source,
  switches,
  tracing,
)
from converters.port.branches import taken_by
from converters.port.errors import PortInputError, PortOutputError, UntracedCreation, Untranslatable
from converters.port.stubs import Stub, StubPort, UnportedBranch, stub_port, stub_source


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


def _call_parameters(cls: type, method: str = '__call__') -> list[str]:
  return list(inspect.signature(getattr(cls, method)).parameters)[1:]


def _shapes(variables) -> set:
  """`(path, shape)` of every variable."""
  return {(jax.tree_util.keystr(p), tuple(getattr(x, 'shape', ()))) for p, x in
          jax.tree_util.tree_flatten_with_path(variables)[0]}


def _is_unreadable(cls: type) -> bool:
  """Whether the source of `cls` cannot be read and parsed."""
  try:
    source.file_of(cls).class_def(cls)
  except (LookupError, OSError, TypeError):
    return True
  return False


@dataclasses.dataclass
class _ClassesWritten:
  """The classes of one writing pass: their ports (stubs' interfaces
  included), what is written for each in order, the stubs and the untraced
  branches written to raise."""

  ports: dict = dataclasses.field(default_factory=dict)
  written: list = dataclasses.field(default_factory=list)
  stubs: list[Stub] = dataclasses.field(default_factory=list)
  branches: list[UnportedBranch] = dataclasses.field(default_factory=list)
  subclasses: set = dataclasses.field(default_factory=set)  # of Flax layers, written as text
  #: The configurations the proof adds that a class is not written for (a
  #: branch only they take, written to raise): their descriptions, and why.
  left_out: dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def untraced(self) -> bool:
    """Whether a class makes a module where no traced configuration went."""
    return any(b.refused is None for b in self.branches) or any(s.untraced for s in self.stubs)


def _write_classes(root: tracing.Created, instances: dict, variables, symbolic: dict,
                   origins: dict[int, str]) -> _ClassesWritten:
  """Each of the user's classes under `root`, innermost first (every
  instance's subtree before the class: another instance may create more).
  `symbolic` keeps each instance's symbolic trace, by `id`, for the next
  pass; `origins` the configuration the proof adds that made an instance
  (its description, by `id`), for none of the model's own."""
  out = _ClassesWritten()

  def symbolic_trace(instance: tracing.Created, cls: type) -> shapes.SymbolicTrace:
    if id(instance) not in symbolic:
      method = instance.calls[0].method if instance.calls else '__call__'
      symbolic[id(instance)] = shapes.symbolic_trace(instance, _call_parameters(cls, method))
    return symbolic[id(instance)]

  ports, written, stubs, branches, subclasses = out.ports, out.written, out.stubs, out.branches, out.subclasses

  def visit(instance: tracing.Created):
    for child in instance.children:
      visit(child)
    cls = instance.cls
    if layers.is_flax_class(cls) or cls in ports or cls in subclasses:
      return
    spec = layers.layer_spec(cls)
    if spec is not None:  # a subclass of a Flax layer (`StdConv(nn.Conv)`)
      subclasses.add(cls)
      try:
        written.append((cls, layer_subclasses.class_source(cls, spec, source.file_of(cls))))
      except Untranslatable as e:
        stub = Stub(cls.__name__, e.line, str(e), source.file_of(cls).path)
        stubs.append(stub)
        ports[cls] = stub_port(cls, instances[cls], stub)
        written.append((cls, layer_subclasses.stub_source(cls, spec, str(e))))
      return
    # The class's whole subtree first: another instance may create more.
    for other in instances[cls][1:]:
      for child in other.children:
        visit(child)
    writer = setup_style if 'setup' in vars(cls) else compact
    try:
      port = writer.port_class(
          cls, instances[cls],
          lambda i, cls=cls: symbolic_trace(i, cls), ports,
      )
    except Untranslatable as e:
      # Stopped by what a configuration the proof adds makes (`scan=True`'s
      # scanned remat): written without it, where it alone takes a branch.
      written_without = _written_without(
          cls, instances[cls], origins, e,
          lambda kept, refused, cls=cls: writer.port_class(
              cls, kept, lambda i: symbolic_trace(i, cls), ports, refused))
      if written_without is None:
        stub_of(cls, e)
        return
      port, left_out = written_without
      out.left_out.update(left_out)
    except Exception as e:  # noqa: BLE001 - whatever stops a class is its stub's reason
      stub_of(cls, e)
      return
    ports[cls] = port
    written.append(port)
    for branch in port.writer.untraced_branches.values():
      file = port.writer.file
      branches.append(UnportedBranch(cls.__name__, branch.line(file), branch.condition(file), file.path,
                                     refused=branch.refused))

  def stub_of(cls: type, e: Exception) -> None:
    """`cls` written as a stub that `e` stopped."""
    # LookupError, OSError, TypeError from `source`: the class's source
    # cannot be read (defined in a function, in a notebook, compiled).
    unreadable = isinstance(e, (LookupError, OSError, TypeError)) and _is_unreadable(cls)
    reason = str(e) if isinstance(e, Untranslatable) else (
        f'its source cannot be read ({e}); define it at the top level of a module, or port it by hand'
        if unreadable else
        f'writing it stopped on {type(e).__name__}: {e}; port it by hand (and tell us: the port '
        'should have said why)')
    line = e.line if isinstance(e, Untranslatable) else None
    try:
      path = source.file_of(cls).path
    except (LookupError, OSError, TypeError):
      path = getattr(inspect.getmodule(cls), '__file__', None) or '<unknown>'
    stub = Stub(cls.__name__, line, reason, path, untraced=isinstance(e, UntracedCreation))
    stubs.append(stub)
    # The classes around it build and call it through this interface.
    ports[cls] = stub_port(cls, instances[cls], stub)
    written.append((cls, stub_source(ports[cls], instances[cls], variables)))


  visit(root)
  return out


def _written_without(cls: type, instances: list, origins: dict[int, str], error: Untranslatable, write):
  """`cls` written from its instances but those of configurations the proof
  adds, where `error` stopped it with them and each instance left out takes
  a branch the port then writes to raise (`write(kept, refused)`, `refused`
  as `ClassWriter.refused`): `(port, {configuration left out: what stopped
  the port there})`; else None. Each configuration is left out in turn,
  and kept out where that moves the stop elsewhere (another flag's
  branch), so no more are left out than stop it; none of the model's own
  ever is."""
  added = list(dict.fromkeys(origins[id(i)] for i in instances if id(i) in origins))
  left_out: dict[str, str] = {}
  stop = error
  for description in added:
    trying = {**left_out, description: str(stop)}
    kept = [i for i in instances if origins.get(id(i)) not in trying]
    refused = [([i for i in instances if origins.get(id(i)) == d], why) for d, why in trying.items()]
    try:
      port = write(kept, refused)
    except Untranslatable as e:
      if (e.line, str(e)) != (stop.line, str(stop)):  # that one stopped it: the next stop is another's
        left_out, stop = trying, e
      continue
    except Exception:  # noqa: BLE001 - stopped otherwise: the stub says the first reason
      continue
    branches = [b for b in port.writer.untraced_branches.values() if b.refused is not None]
    if all(any(taken_by(b, port.writer.file, i) for b in branches) for group, _ in refused for i in group):
      return port, trying
  return None


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
    sites = {(c.cls, c.site, c.transform) for c in other_root.walk()}
    # Another branch on the sizes, though its shapes may be the model's
    # (`rep_size=False` makes no `pre_logits`; `mlp_dim=None` where 4 * d is mlp_dim).
    other_branch = sites < made or kinds is not None and shapes.size_kinds(other.module) != kinds
    if not sites <= made or sizes and (stops_decoding or other_branch
                                       or not _shapes(other_variables) <= _shapes(variables)):
      flags.append((other, description, other_root, other_variables))
    else:
      within.append((other, description))  # nothing made or sized that the model does not
  return flags, within


def write(linen_model: LinenModel, *, factory: str = '', module_name: str = 'models_nnx',
          test_name: str = '') -> tuple[PortResult, dict]:
  """The generated file for `linen_model`, not yet proven."""
  module = linen_model.module
  if (spec := layers.layer_spec(type(module))) is not None:
    raise PortInputError(
        f'the model is {type(module).__name__}, {"a subclass of " if spec.subclass else ""}Flax\'s '
        f'{spec.linen.__mro__[1 if spec.subclass else 0].__name__}: port a model that creates it (its port is '
        f'written with that model\'s)' if spec.subclass else f'the model is Flax\'s {type(module).__name__}: '
        f'use {spec.nnx} itself')
  try:
    root, variables = tracing.trace(module, *linen_model.args, **linen_model.kwargs)
  except Exception as e:  # noqa: BLE001 - the user's model: any error of its own
    unbound = isinstance(e, NameError) and 'unbound axis name' in str(e)
    raise PortInputError(
        f'{type(module).__name__}.init on the example inputs failed: {type(e).__name__}: '
        f'{str(e).splitlines()[0] if str(e) else ""}'
        + ('; a layer reduces over a mapped axis outside training (LayerNorm(axis_name=...)), which the '
           'port traces without: port it by hand' if unbound else '')
    ) from e
  instances: dict[type, list[tracing.Created]] = {}
  for instance in root.walk():
    instances.setdefault(instance.cls, []).append(instance)
  made = {(c.cls, c.site, c.transform) for c in root.walk()}
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
  flags, within = _making_more([*prove.flag_configurations(linen_model, refused), *optional], variables, made,
                               kinds=shapes.size_kinds(module))
  origins: dict[int, str] = {}  # the configuration that made an instance, by id
  for _, description, other_root, _ in flags:
    for instance in other_root.walk():
      instances.setdefault(instance.cls, []).append(instance)
      origins[id(instance)] = description
  symbolic: dict = {}  # (the instances stay alive in `instances`: their ids stay theirs)
  pass_ = _write_classes(root, instances, variables, symbolic, origins)
  if pass_.untraced:
    # A module made where no configuration traced so far went (a loop the
    # model's runs no times): the other configurations the proof tries, where
    # they go there, are written from too.
    made |= {(c.cls, c.site, c.transform) for _, _, other_root, _ in flags for c in other_root.walk()}
    more, _ = _making_more(prove.other_configurations(linen_model, most=2), variables, made, sizes=False)
    more = more[:1]  # (the other one mostly goes where it goes: its symbolic traces, twice the time)
    if more:
      flags += more
      for _, description, other_root, _ in more:
        for instance in other_root.walk():
          instances.setdefault(instance.cls, []).append(instance)
          origins[id(instance)] = description
      pass_ = _write_classes(root, instances, variables, symbolic, origins)
  ports, written, stubs, branches = pass_.ports, pass_.written, pass_.stubs, pass_.branches
  # The configurations a class is not written for (a branch only they take
  # raises): neither mapped nor proven; the report says so.
  flags = [f for f in flags if f[1] not in pass_.left_out]
  # The variables of every flag's configuration too (the scanned layers'),
  # where they do not contradict the traced configuration's; none under a
  # stub, whose port is not written (`unmapped`).
  pairs = emit.path_pairs(root, variables, ports)
  traced = [(other_root, other_variables) for _, _, other_root, other_variables in flags]
  # A flag that makes a cache (`decode`) with each other flag that changes
  # what is built (`scan_layers`): the scanned layers' caches, which the
  # proof converts too (`port`'s pairs).
  for decoder, *_, decoder_variables in flags:
    for other, *_ in flags if 'cache' in decoder_variables else ():
      if other is not decoder and (both := prove.combined(linen_model, decoder, other)) is not None:
        both_root, both_variables = tracing.trace(both.module, *both.args, **both.kwargs)
        if not _takes_a_raised_branch(both_root, ports):
          traced.append((both_root, both_variables))
  for other_root, other_variables in traced:
    known = {linen: nnx_path for linen, nnx_path, *_ in pairs}
    held = {nnx_path: linen for linen, nnx_path, *_ in pairs}
    more = emit.path_pairs(other_root, other_variables, ports)
    if all(known.get(linen, nnx_path) == nnx_path and held.get(nnx_path, linen) == linen
           for linen, nnx_path, *_ in more):
      pairs += [p for p in more if p[0] not in known]
  mapping = emit.mapping_of(pairs)
  unmapped = emit.under_stubs(root, variables, ports)
  # The model's mode: its call's flags and its fields that the mode replaced.
  modes = {**ports[type(module)].modes, **ports[type(module)].field_modes}
  generated = emit.write_file(
      written, mapping, factory=factory, module_name=module_name, test_name=test_name, modes=modes,
      unmapped=unmapped,
  )
  files = {source.file_of(c).path for c in [type(module), *ports, *(s[0] for s in written if isinstance(s, tuple))]}
  result = PortResult(generated.text, generated.classes, stubs, dict(modes), generated.paths_text,
                      sources=sorted(files))
  result.variables = variables
  root_writer = getattr(ports.get(type(module)), 'writer', None)
  result.ties = dict(root_writer.symbolic.ties) if root_writer is not None else {}
  result.linen_classes = [w.cls if isinstance(w, classes.ClassPort) else w[0] for w in written]
  result.refused_flags = [*refused, *(d for d, _ in unbuilt)]
  result.flags = [(other, description, other_variables) for other, description, _, other_variables in flags]
  result.optional, result.unproven = optional, unproven
  result.within = within
  result.mapping = mapping
  result.branches = branches
  result.left_out = dict(pass_.left_out)
  result.flax_layers = frozenset(i.cls for i in root.walk() if layers.is_flax_class(i.cls))
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
  module_name = _import_name(out)
  test_name = os.path.basename(test_out) if test_out else ''
  result, ports = write(linen_model, factory=factory, module_name=module_name, test_name=test_name)
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
  for written in ports.values():
    for name, dtype in getattr(getattr(written, 'writer', None), 'dtype_parameters', {}).items():
      # Linen made a variable in the dtype of a value of the call: NNX, which
      # builds before any call, takes it as a keyword of the constructor.
      result.checks.append((f'{written.cls.__name__}({name}=...)', f'jnp.{dtype} unless given',
                            f'Linen makes its variables in the dtype of {name.removesuffix("_dtype")} at the '
                            'call: give that dtype where it is not the traced one'))
  if test_out is not None:
    decoding = any('cache' in v for _, _, v in result.flags)
    emit.write_text(test_out, test_file(factory, out, result.modes, decoding=decoding,
                                        decodes_only='cache' in result.variables))
  if result.stubs:
    _prove_around_stubs(linen_model, out, result, ports)
    return result
  start = time.perf_counter()
  try:
    generated = prove.import_file(out)
    prove_one = prove.assert_generated_decoding if 'cache' in result.variables else prove.assert_generated_port
    atol = prove_one(linen_model, generated, modes=result.modes)
  except Exception as e:  # noqa: BLE001 - a failed proof is the result, reported
    result.failure = ''.join(traceback.format_exception_only(e)).strip()
    result.checks.append(('assert_port_equivalent', 'FAILED', f'{time.perf_counter() - start:.2f} s'))
    return result
  result.checks.append(('assert_port_equivalent', 'passed', f'{time.perf_counter() - start:.2f} s'))
  result.checks += tolerance_checks(result.flax_layers, atol)
  # The classes are written for any configuration: proven at others too, with
  # the mapping the writer gives for them (the traced one's may name layers
  # by a count that changed).
  for tie in prove.tie_descriptions(result.ties):
    result.checks.append(('assumed of the inputs (the code ties them)', tie, 'proven with inputs so'))
  others = prove.other_configurations(linen_model, most=2, ties=result.ties)
  if not others:
    # Nothing shows the sizes are not the traced numbers: not handed over as proven.
    result.failure = ('no other configuration of the model builds in Linen (every integer one more, '
                      'doubled, tuples longer, inputs wider), so the sizes the port writes are '
                      'proven at the traced one only; check them by hand')
    result.checks.append(('another configuration', 'NOT PROVEN', 'none builds'))
    return result
  # A flag that makes a cache (`decode`) with each other flag that changes
  # what is built (`scan_layers`): the scanned layers' caches.
  decoding = [(o, d) for o, d, v in result.flags if 'cache' in v]
  pairs = []
  for decoder, decode_change in decoding:
    for other, change, _ in result.flags:
      if other is decoder:
        continue
      both = prove.combined(linen_model, decoder, other)
      if both is None:
        result.checks.append((f'another configuration ({decode_change}, {change})', 'not built by Linen',
                              'not proven'))
      else:
        pairs.append((both, f'{decode_change}, {change}'))
  for description in result.refused_flags:
    result.checks.append((f'another configuration ({description})', 'not built by Linen', 'not proven'))
  # Each field left None given a value: the branch the traced configuration skipped.
  for name, why in result.unproven:
    result.checks.append((f'another configuration ({name} given a value)', why, 'not proven'))
  for description, why in result.left_out.items():
    result.checks.append((f'another configuration ({description})', 'raises NotImplementedError',
                          f'not proven: {why}'))
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
  decoding_proven = 'cache' in result.variables
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
  for other, changes in [*others, *flags, *pairs, *calls, *optional, *moved]:
    start = time.perf_counter()
    try:
      root, variables = tracing.trace(other.module, *other.args, **other.kwargs)
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
      decoding_proven |= 'cache' in variables
      prove_one(other, generated, modes=result.modes, paths=paths, as_written=as_written)
    except Exception as e:  # noqa: BLE001 - a failed proof is the result, reported
      result.failure = f'at {changes}: ' + ''.join(traceback.format_exception_only(e)).strip()
      result.checks.append((f'another configuration ({changes})', 'FAILED',
                            f'{time.perf_counter() - start:.2f} s'))
      return result
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
      return result
  result.proven = not problems
  return result


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
  (`ClassWriter.untraced_branches`)."""
  root = model if isinstance(model, tracing.Created) else tracing.trace(model.module, *model.args, **model.kwargs)[0]
  for instance in root.walk():
    writer = getattr(ports.get(instance.cls), 'writer', None)
    if writer is not None and any(taken_by(b, writer.file, instance) for b in writer.untraced_branches.values()):
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
