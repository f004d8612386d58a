"""One writing pass of `generate.write`: the user's classes under a traced
model, each written as an NNX class from all its instances, innermost first.

A class is written by `compact` or `setup_style` (a subclass of a Flax layer
by `layer_subclasses`); what stops it makes it a stub (`stubs`), unless
leaving out instances of configurations the proof adds lets it be written,
their branches then written to raise.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from converters.port import compact, layer_subclasses, layers, setup_style, shapes, source, tracing
from converters.port.branches import taken_by
from converters.port.errors import UntracedCreation, Untranslatable
from converters.port.stubs import Stub, UnportedBranch, stub_port, stub_source


@dataclasses.dataclass
class ClassesWritten:
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


def write_classes(root: tracing.Created, instances: dict, variables, symbolic: dict,
                  origins: dict[int, str]) -> ClassesWritten:
  """Each of the user's classes under `root`, innermost first (every
  instance's subtree before the class: another instance may create more).
  `instances` holds each class's instances, the model's and those of the
  configurations the proof adds; `variables` are the model's; `symbolic`
  keeps each instance's symbolic trace, by `id`, for the next pass;
  `origins` the configuration the proof adds that made an instance (its
  description, by `id`), for none of the model's own."""
  writing = _Writing(instances, variables, symbolic, origins)
  writing.visit(root)
  return writing.out


class _Writing:
  """A writing pass under way: what it writes from, and `out`, what it has
  written so far."""

  def __init__(self, instances: dict, variables, symbolic: dict, origins: dict[int, str]):
    self.instances = instances
    self.variables = variables
    self.symbolic = symbolic
    self.origins = origins
    self.out = ClassesWritten()

  def symbolic_trace(self, cls: type, instance: tracing.Created) -> shapes.SymbolicTrace:
    """The symbolic trace of `instance` of `cls`, traced once for every pass."""
    if id(instance) not in self.symbolic:
      method = instance.calls[0].method if instance.calls else '__call__'
      self.symbolic[id(instance)] = shapes.symbolic_trace(instance, _call_parameters(cls, method))
    return self.symbolic[id(instance)]

  def visit(self, instance: tracing.Created) -> None:
    for child in instance.children:
      self.visit(child)
    cls = instance.cls
    if layers.is_flax_class(cls) or cls in self.out.ports or cls in self.out.subclasses:
      return
    spec = layers.layer_spec(cls)
    if spec is not None:  # a subclass of a Flax layer (`StdConv(nn.Conv)`)
      self.write_layer_subclass(cls, spec)
      return
    # The class's whole subtree first: another instance may create more.
    for other in self.instances[cls][1:]:
      for child in other.children:
        self.visit(child)
    self.write_class(cls)

  def write_layer_subclass(self, cls: type, spec: layers.LayerSpec) -> None:
    out = self.out
    out.subclasses.add(cls)
    try:
      out.written.append((cls, layer_subclasses.class_source(cls, spec, source.file_of(cls))))
    except Untranslatable as e:
      stub = Stub(cls.__name__, e.line, str(e), source.file_of(cls).path)
      out.stubs.append(stub)
      out.ports[cls] = stub_port(cls, self.instances[cls], stub)
      out.written.append((cls, layer_subclasses.stub_source(cls, spec, str(e))))

  def write_class(self, cls: type) -> None:
    out = self.out
    writer = setup_style if 'setup' in vars(cls) else compact
    symbolic_trace = functools.partial(self.symbolic_trace, cls)
    try:
      port = writer.port_class(cls, self.instances[cls], symbolic_trace, out.ports)
    except Untranslatable as e:
      # Stopped by what a configuration the proof adds makes (`scan=True`'s
      # scanned remat): written without it, where it alone takes a branch.
      written_without = _written_without(
          cls, self.instances[cls], self.origins, e,
          lambda kept, refused: writer.port_class(cls, kept, symbolic_trace, out.ports, refused))
      if written_without is None:
        self.write_stub(cls, e)
        return
      port, left_out = written_without
      out.left_out.update(left_out)
    except Exception as e:  # noqa: BLE001 - whatever stops a class is its stub's reason
      self.write_stub(cls, e)
      return
    out.ports[cls] = port
    out.written.append(port)
    for branch in port.untraced_branches:
      out.branches.append(UnportedBranch(cls.__name__, branch.line(port.file), branch.test(port.file),
                                         branch.is_else, port.file.path, refused=branch.refused))

  def write_stub(self, cls: type, e: Exception) -> None:
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
    out = self.out
    out.stubs.append(stub)
    # The classes around it build and call it through this interface.
    out.ports[cls] = stub_port(cls, self.instances[cls], stub)
    out.written.append((cls, stub_source(out.ports[cls], self.instances[cls], self.variables)))


def _call_parameters(cls: type, method: str = '__call__') -> list[str]:
  return list(inspect.signature(getattr(cls, method)).parameters)[1:]


def _is_unreadable(cls: type) -> bool:
  """Whether the source of `cls` cannot be read and parsed."""
  try:
    source.file_of(cls).class_def(cls)
  except (LookupError, OSError, TypeError):
    return True
  return False


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
    branches = [b for b in port.untraced_branches if b.refused is not None]
    if all(any(taken_by(b, port.file, i) for b in branches) for group, _ in refused for i in group):
      return port, trying
  return None
