"""One Linen class written with `@nn.compact`, rewritten as an NNX class.

Linen creates submodules where it calls them; NNX creates them in `__init__`
and calls them in `__call__`. From the compact method this writes both:

- `__init__` takes the Linen fields (same names, annotations and defaults),
  keeps them as attributes, and replays the part of the compact method that
  decides which modules exist: the loops and conditions around the creating
  expressions and the locals they read. Each creation becomes an NNX one,
  with the input size Linen inferred written as an expression of the fields
  and the inputs' shapes (`converters.port.shapes`), never as the traced
  number unless the source has it as a constant. Inputs whose sizes are
  needed become keyword arguments: `in_features` (the last axis of the only
  one needed) or `<argument>_shape`.
- `__call__` is the compact method with each creating expression replaced by
  the attribute holding the module: `self.dense_0`, or for modules created
  in a loop the loop over their `nnx.List` (`for conv in self.convs`).
- Flags the layers take from the call (`deterministic=not train`) become the
  NNX module's mode (`model.train()` / `model.eval()`): the argument leaves
  the signature when that is all it does.

The writer's parts: the attributes holding the modules (`attribute_names`),
`__init__`'s body (`compact_init`, with the locals it replays,
`replayed_locals`) and `__call__` (`compact_call`, reading the modules as
`module_reads` says, calling those Linen lifted as `lifted_calls` does).

What it cannot write it raises as `Untranslatable`, which the caller turns
into a marked stub.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from converters.port import (
  attribute_names,
  classes,
  compact_call,
  compact_init,
  layers,
  references,
  replayed_locals,
  source,
  syntax,
  tracing,
  variables,
)
from converters.port.classes import ClassPort
from converters.port.errors import Untranslatable


def _compact_method(cdef: cst.ClassDef, file: source.SourceFile, cls: type) -> cst.FunctionDef:
  methods = [s for s in cdef.body.body if isinstance(s, cst.FunctionDef)]
  if any(m.name.value == 'setup' for m in methods):
    raise Untranslatable(cls, file.line_of(cdef), 'a module with setup(): not yet ported; port it by hand')
  compact = [
      m for m in methods
      if any(references.is_linen(d.decorator, file, 'compact') for d in m.decorators)
  ]
  if len(compact) != 1 or compact[0].name.value != '__call__':
    raise Untranslatable(
        cls, file.line_of(cdef),
        'only a module whose @nn.compact method is __call__ is ported yet; port it by hand',
    )
  return compact[0]


def _call_time_names(method: cst.FunctionDef, params: Sequence[str]) -> set[str]:
  """The arguments and every local computed from them (flow-insensitive)."""
  names = set(params)
  assignments: list[tuple[list[str], cst.CSTNode]] = []

  class Visitor(cst.CSTVisitor):
    def visit_Assign(self, n: cst.Assign):
      assignments.append(([x for t in n.targets for x in syntax.target_names(t.target)], n.value))

    def visit_AugAssign(self, n: cst.AugAssign):
      assignments.append((syntax.target_names(n.target), n))

    def visit_For(self, n: cst.For):
      assignments.append((syntax.target_names(n.target), n.iter))

    def visit_AnnAssign(self, n: cst.AnnAssign):
      if n.value is not None:
        assignments.append((syntax.target_names(n.target), n.value))

  method.body.visit(Visitor())
  changed = True
  while changed:
    changed = False
    for targets, value in assignments:
      if not set(targets) <= names and syntax.names_in(value) & names:
        names |= set(targets)
        changed = True
  return names


class CompactWriter(classes.ClassWriter):
  """Writes one class whose submodules its `@nn.compact` `__call__` creates."""

  writes_has_cache = True
  writes_draws = True
  keeps_factories = True
  writes_lifted_call = True
  writes_shared_scopes = True
  writes_handed_functions = True

  def _methods(self) -> tuple[cst.FunctionDef, cst.FunctionDef]:
    method = _compact_method(self.cdef, self.file, self.cls)
    return method, method

  def _call_time(self) -> set[str]:
    return _call_time_names(self.method, self.params)

  def loops_around(self, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The loops around `node` inside the method, innermost first."""
    out = []
    for parent in self.file.ancestors(node):
      if parent is self.method:
        break
      if isinstance(parent, (cst.For, cst.While)):
        out.append(parent)
      if isinstance(parent, (cst.FunctionDef, cst.Lambda, cst.ListComp, cst.GeneratorExp)):
        self.fail(node, 'a module created in a nested function or comprehension; port it by hand')
    return out

  def _attributes(self) -> dict[tracing.Site, tuple[str, bool]]:
    return attribute_names.AttributeNames(self, self.exclusive).attributes()

  def write(self) -> ClassPort:
    self.node_sites = {node: site for site, (node, _) in self.sites.items()}
    self.own = self._own_variables()
    if self.scans_call:
      self._check_scanned_call()
    init_body = compact_init.InitBody(self).block(list(self.method.body.body))
    replayed_locals.check_bound_once(self, init_body)
    replayed = frozenset(syntax.code_of(s) for s in init_body if isinstance(s, cst.SimpleStatementLine))
    call = compact_call.call_method(self, replayed)
    return self._assemble(init_body, {self.method: call})

  def _check_scanned_call(self) -> None:
    """What runs in `__call__` under Linen's scan over its inputs holds
    parameters only (broadcast: the same at every step) and draws nothing:
    NNX's scan of the method then runs the same program. Anything else
    (stacked or carried variables, keys split per step, modes) is refused."""
    if self.draws:
      self.fail(self.call, 'self.make_rng in a method Linen scans (keys per step): port it by hand')
    for node, children in self.sites.values():
      for child in children:
        spec = layers.layer_spec(child.cls)
        if spec is None or spec.mode or spec.module_fields:
          self.fail(node, f'{child.cls.__name__} created in a method Linen scans: only Flax\'s layers without '
                    'modes are written there (their parameters broadcast); port it by hand')
    for call, variable in self.own.items():
      if variable.collection != 'params':
        self.fail(call, f'a {variable.collection!r} variable in a method Linen scans; port it by hand')
    sows: list[cst.Call] = []
    self.method.body.visit(syntax.CallsWhere(variables.is_sow_call, sows))
    if sows:
      self.fail(sows[0], 'self.sow in a method Linen scans; port it by hand')


def port_class(cls, instances, symbolic_trace, child_ports, refused=None) -> ClassPort:
  """The NNX class of the Linen class `cls`, written from the instances the
  model made of it (`symbolic_trace(instance)` gives the sizes; `child_ports`
  are the ports of the user's classes it creates; `refused`, as
  `ClassWriter.refused`). Raises `Untranslatable`."""
  return CompactWriter(cls, instances, symbolic_trace, child_ports, refused).write()
