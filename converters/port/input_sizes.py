"""The sizes a port's constructor reads off its inputs and its layers: the
input size of each creation site of a class, written as one expression of
the fields and inputs, a running variable over a loop, a size an `if` on the
configuration switches, or the output size of the layer made before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import layers, shapes, source, switched_sizes, syntax, tracing

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


class InputSizes:
  """The sizes of one class's creations, for its `ClassWriter`, which holds
  the sites, the symbolic traces and the source they are read from."""

  def __init__(self, writer: ClassWriter):
    self.writer = writer
    self.file, self.fail = writer.file, writer.fail
    #: The inputs' dimensions the constructor reads (`x_shape[-1]`).
    self.used_dims: set[shapes.InputDim] = set()
    #: A symbolic child (by id) -> the table of the trace it is in.
    self.tables: dict[int, shapes.SymbolTable] = {}
    #: A loop (by id) -> (the initial size, the running variable).
    self.running: dict[int, tuple[str, str]] = {}

  def use_input_dim(self, index: int, dim: int) -> None:
    """The constructor takes dimension `dim` of array input `index`."""
    array = self.writer.instance.calls[0].args[index]
    name = self.writer.params[index] if index < len(self.writer.params) else f'arg{index}'
    self.used_dims.add(shapes.InputDim(index, name, dim, len(array.shape), array.shape[dim]))

  def size_source(self, value, table: shapes.SymbolTable | None = None) -> str:
    if isinstance(value, shapes.Unfitted):
      self.fail(None, f'a size Linen infers changes with {value.what} in a way the port cannot '
                'write (it holds at the traced value only); port it by hand')
    table = table or self.writer.symbolic.table
    for name in table.symbols_in(value):
      origin = table.origins[name]
      if isinstance(origin, shapes.InputDim):
        self.used_dims.add(origin)
    return table.source(value, self.origin_placeholder)

  @staticmethod
  def origin_placeholder(origin) -> str:
    if isinstance(origin, shapes.FieldLength):
      return f'len({shapes.access_source(origin.access)})'
    if isinstance(origin, shapes.FieldValue):
      return shapes.access_source(origin.access, origin.last)
    return f'__input_{origin.index}_{origin.dim}'

  def symbolic_child(self, child: tracing.Created) -> tracing.Created:
    """`child` in the symbolic trace of the instance that created it (its
    table is `self.tables[id(...)]`)."""
    trace = self.writer.symbolic_of(child.parent)
    if child.shares_scope:  # named as its parent is: the k-th such child
      ours = [c for c in child.parent.children if c.shares_scope]
      theirs = [c for c in trace.root.children if c.shares_scope]
      candidates = theirs[ours.index(child):][:1] if len(ours) == len(theirs) else []
    else:
      candidates = [c for c in trace.root.children if c.name == child.name]
    for candidate in candidates:
      self.tables[id(candidate)] = trace.table
      return candidate
    self.fail(None, f'{child.name} is not created when the sizes are symbolic; port it by hand')

  def child_size(self, symbolic_child, value) -> str:
    return self.size_source(value, self.tables[id(symbolic_child)])

  def in_size(self, site, node, axis_of, index: int = 0) -> str:
    """The source of the input size of `site`'s modules (of their array input
    `index`): one expression for every execution, or a running variable."""
    node, children = self.writer.sites[site]
    values, sizes = [], []  # (symbolic child, size) of every creation
    for child in children:
      symbolic = self.symbolic_child(child)
      spec = layers.layer_spec(child.cls)
      if not symbolic.calls and spec is not None and spec.in_from_kernel:
        # Called inside a transform only (an RNN's cell): its kernel says.
        kernel = self.writer.symbolic_of(child.parent).variables.get('params', {}).get(child.name, {})
        for key in spec.in_from_kernel:
          kernel = kernel.get(key, {}) if isinstance(kernel, dict) else {}
        if hasattr(kernel, 'shape'):
          value = kernel.shape[0]
          sizes.append((symbolic, value))
          if child.parent is self.writer.instance:
            values.append(value)
          continue
      if not symbolic.calls:
        self.fail(node, f'{child.name} is never called on the traced inputs, so its input size is '
                  'unknown; port it by hand')
      inputs = symbolic.calls[0].args
      if spec is not None and index == 0:
        index = spec.input_index
      if len(inputs) <= index or not hasattr(inputs[index], 'shape'):
        self.fail(node, f'{child.name} is called without an array input; port it by hand')
      value = inputs[index].shape[axis_of(child)]
      sizes.append((symbolic, value))
      if child.parent is self.writer.instance:
        values.append(value)
    first = [c for c in children if c.parent is self.writer.instance]
    # A running size is written from the loop's own sizes: what each
    # creation's size fits over other counts (a block that moves to another
    # stage when a stage is longer) is not asked for then.
    running = self.running_size(node, first, values, uniform=len({str(v) for _, v in sizes}) == 1)
    if running is not None:
      return running
    texts = {self.child_size(symbolic, value) for symbolic, value in sizes}
    if len(texts) == 1:
      return texts.pop()
    by_size: dict[str, list[tracing.Created]] = {}
    for child, (symbolic, value) in zip(children, sizes):
      by_size.setdefault(self.child_size(symbolic, value), []).append(child.parent)
    switched = self.switched(node, by_size)
    if switched is not None:
      return switched
    chained = self.chained(node, children, sizes)
    if chained is not None:
      return chained
    self.fail(node, f'the input size of {children[0].cls.__name__} changes from one creation to the '
              'next in a way the port cannot write; port it by hand')

  def chained(self, node, children, sizes) -> str | None:
    """`node`'s input size read off the Flax layer made before it (past
    layers that keep it: an activation, a norm), where the instances' sizes
    differ otherwise than by one expression of the fields: big_vision's
    `Dense(self.mlp_dim or 4 * d)` then `Dense(d)` (`self.dense_0.
    out_features`, `mlp_dim` None in some instances), or its `pre_logits`
    made `if self.rep_size:` (a flag or a width) before the head
    (`self.pre_logits.out_features if rep_size else width`). None where
    that is not so."""
    if self.writer.loops_around(node):
      return None
    by_site: dict = {}  # the site of the layer before (None: none) -> [(instance, size)]
    for child, (symbolic, value) in zip(children, sizes):
      site = self.layer_before(child, symbolic, value)
      by_site.setdefault(site, []).append((child.parent, self.child_size(symbolic, value)))
    if len(by_site) > 2 or None in by_site and len(by_site[None]) and len({t for _, t in by_site[None]}) > 1:
      return None
    around = set(syntax.between(self.file, node, self.writer.method))
    written: list[tuple[str, list, cst.If | None]] = []  # (size, instances, the `if` it needs)
    for site, found in by_site.items():
      texts = {t for _, t in found}
      if len(texts) == 1:
        written.append((texts.pop(), [i for i, _ in found], None))
        continue
      writer = self.writer
      if site not in writer.attributes or writer.attributes[site][1] or site in writer.inlined or writer.loops_around(
          writer.sites[site][0]):
        return None
      spec = layers.layer_spec(self.writer.sites[site][1][0].cls)
      conditions = [a for a in syntax.between(self.file, self.writer.sites[site][0], self.writer.method)
                    if isinstance(a, cst.If) and a not in around]
      if len(conditions) > 1 or conditions and self.writer.sites[site][0] not in syntax.descendants(conditions[0].body):
        return None
      written.append((f'self.{self.writer.attributes[site][0]}.{spec.nnx_argument(spec.out_features)}',
                      [i for i, _ in found], conditions[0] if conditions else None))
    if len(written) == 1:
      size, _, condition = written[0]
      return size if condition is None else None
    (first, first_instances, first_if), (second, second_instances, second_if) = written
    if first_if is None:
      (first, first_instances, first_if), (second, second_instances, second_if) = written[::-1]
    if first_if is None or second_if is not None:
      return None
    test = first_if.test
    if self.writer.call_time & source.names_in(test) or not (
        all(switched_sizes.test_value(self.file, test, i) is True for i in first_instances)
        and all(switched_sizes.test_value(self.file, test, i) is False for i in second_instances)):
      return None
    written_test = switched_sizes.init_test(test, self.file, self.writer.field_names)
    return None if written_test is None else f'{first} if {written_test} else {second}'

  def layer_before(self, child, symbolic, value) -> tracing.Site | None:
    """The site of the Flax layer `child`'s parent made before it (past
    layers that keep their input's size) whose output size is `value`,
    `child`'s input size; None where there is none."""
    order = list(self.writer.symbolic_of(child.parent).root.children)
    index = order.index(symbolic) - 1
    while index >= 0 and (spec := layers.layer_spec(type(order[index].module))) is not None \
            and spec.out_features is None and spec.sequence_field is None:
      index -= 1
    if index < 0:
      return None
    before = order[index]
    made = next((c for c in child.parent.children if c.name == before.name), None)
    spec = layers.layer_spec(type(before.module))
    if made is None or spec is None or spec.out_features is None or str(self.out_size(before)) != str(value):
      return None
    return self.writer.site_of(made)

  def switched(self, node, sizes: dict[str, list[tracing.Created]]) -> str | None:
    """The size an `if` on the configuration before `node` switches
    (`switched_sizes`); None where none does."""
    writer = self.writer
    return switched_sizes.switched_size(self.file, writer.method, node, sizes, writer.call_time, writer.field_names)

  def running_size(self, node, children, values, uniform: bool) -> str | None:
    """A running variable for the input size, when each layer of a loop
    takes the previous creation's output size (set before the loop and after
    each creation in it), or a layer right after such a loop does: the
    sizes then hold for any number of iterations, where the traced sizes hold
    for the traced number only. None where that is not so."""
    if not children:
      return None
    order = list(self.writer.symbolic.root.children)
    loops = self.writer.loops_around(node)
    previous_loops = []
    for k, (child, value) in enumerate(zip(children, values)):
      index = order.index(self.symbolic_child(child))
      if index == 0:
        if loops and k == 0:
          continue
        return None
      before = order[index - 1]
      if k == 0:
        # Past layers that keep their input's size (a dropout, a norm after
        # the loop): the loop's running size is theirs too.
        made = index - 1
        while made > 0 and self.keeps_size(order[made]):
          made -= 1
        made_before = next((c for c in self.writer.instance.children if c.name == order[made].name), None)
        if made_before is not None and self.writer.site_of(made_before) in self.writer.sites:
          previous_loops = self.writer.loops_around(self.writer.sites[self.writer.site_of(made_before)][0])
        # The first layer of the loop starts from what came before it; any
        # other chains from the layer before it in the loop (two streams in
        # one loop do not).
        if loops and not (previous_loops and previous_loops[-1] is loops[-1]):
          continue
      out = self.out_size(before)
      if out is None or str(out) != str(value):
        return None
    if loops:
      loop = loops[-1]
      if id(loop) not in self.running:
        if not all(self.out_source(s) is not None for s in self.sites_in(loop)):
          return None
        if uniform and not any(self.out_source(s) for s in self.sites_in(loop)):
          return None  # every layer of the loop keeps the size: the size itself reads better
        initial = self.size_source(values[0])
        taken = source.names_in(self.writer.method)
        name = next(n for n in (['in_features'] if initial.startswith('__input_') else []) + [
            'in_size', 'size_in', 'running_size'] if n not in taken)
        self.running[id(loop)] = (initial, name)
      return self.running[id(loop)][1]
    if previous_loops and id(previous_loops[-1]) in self.running:
      return self.running[id(previous_loops[-1])][1]
    return None

  def keeps_size(self, symbolic_child: tracing.Created) -> bool:
    """Whether a Flax layer made outside any loop gives its input's size."""
    spec = layers.layer_spec(type(symbolic_child.module))
    writer = self.writer
    made = next((c for c in writer.instance.children if c.name == symbolic_child.name), None)
    return (spec is not None and spec.out_features is None and spec.sequence_field is None and made is not None
            and writer.site_of(made) in writer.sites and not writer.loops_around(writer.sites[writer.site_of(made)][0]))

  def sites_in(self, loop) -> list:
    return [site for site, (n, _) in self.writer.sites.items() if loop in self.file.ancestors(n)]

  def out_source(self, site) -> str | None:
    """Source of the output size of `site`'s modules: `''` for a layer that
    keeps its input's (a norm, a dropout), None if not known."""
    node, children = self.writer.sites[site]
    child = children[0]
    spec = layers.layer_spec(child.cls)
    if site in self.writer.helpers:
      return '' if spec is not None and spec.out_features is None else None
    arguments = dict(self.writer.arguments.of(node, child.cls))
    if spec is not None and spec.sequence_field is not None:
      return None  # a Sequential's: its last layer's, not written yet
    if spec is not None:
      if spec.out_features is None:
        return ''
      arg = arguments.get(spec.out_features)
      return None if arg is None else self.file.code(arg.value)
    if child not in [c for c in self.writer.instance.children]:
      return None
    symbolic = self.symbolic_child(child)
    out = self.out_size(symbolic)
    if out is None:
      return None
    for field, arg in arguments.items():
      value = getattr(symbolic.module, field, None)
      if str(value) == str(out):
        return self.file.code(arg.value)
      if isinstance(value, shapes.Unfitted):
        value = value.value  # compared as the traced value, as above
      if not isinstance(value, bool) and (isinstance(value, int) or hasattr(value, 'dimension_as_value')
                                          or type(value).__name__ == '_DimExpr'):
        for m in shapes.WIDENINGS:
          if str(value * m) == str(out):  # a bottleneck's `filters * 4`
            atomic = isinstance(arg.value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.Integer)) or (
                isinstance(arg.value, cst.BinaryOperation)
                and isinstance(arg.value.operator, (cst.Multiply, cst.Power)))
            code = self.file.code(arg.value)
            return f'{code} * {m}' if atomic else f'({code}) * {m}'
    return None

  def out_size(self, symbolic_child: tracing.Created):
    spec = layers.layer_spec(type(symbolic_child.module))
    if spec is not None and spec.out_features is not None:
      return getattr(symbolic_child.module, spec.out_features)
    outputs = symbolic_child.calls[0].outputs
    return outputs.shape[-1] if hasattr(outputs, 'shape') else None

  def feature_axis_of(self, node):
    """`child -> the input axis whose size its NNX layer takes`, refusing a
    layer over several axes (`node` names it)."""
    def axis_of(child):
      axis = layers.feature_axis(child.module)
      if axis is None:
        self.fail(node, f'{child.cls.__name__} over several feature axes; port it by hand')
      return axis

    return axis_of

  def kv_size(self, site, node, spec: layers.LayerSpec) -> str | None:
    """The size of the key and value inputs where calls give the layer
    them besides the query, positionally as NNX takes them (`attn(x,
    context)`; `attn(x, x)`, self-attention as ViT writes it): for NNX's
    `kv_features` argument. None where no call does."""
    given = False
    for child in self.writer.sites[site][1]:
      for call in child.calls:
        named = [name for name, a in call.kwargs.items() if hasattr(a, 'shape') and name != 'mask']
        if named:
          self.fail(node, f'{spec.nnx} is called with {", ".join(f"{n}=" for n in named)} besides the '
                    'query; pass the keys and values positionally (attn(x, context)), as both Linen '
                    'and NNX take them, or port it by hand')
        arrays = [a for a in call.args[1:] if hasattr(a, 'shape')]
        if len({a.shape[-1] for a in arrays}) > 1:
          self.fail(node, f'{spec.nnx} is called with keys and values of different widths, which NNX '
                    'takes to be one size; port it by hand')
        given = given or bool(arrays)
    return self.in_size(site, node, lambda child: -1, 1) if given else None

  def input_size_argument(self, site, node, field: str, arg: cst.Arg) -> str:
    """The source of a layer's size argument computed from the call's inputs."""
    texts = set()
    for child in self.writer.sites[site][1]:
      symbolic = self.symbolic_child(child)
      value = getattr(symbolic.module, field)
      if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, 'dimension_as_value')
                                         or type(value).__name__ == '_DimExpr'):
        self.fail(
            node,
            f'{field}={self.file.code(arg.value)} depends on the inputs of the call; NNX '
            'builds its layers before any call: port it by hand',
        )
      texts.add(self.child_size(symbolic, value))
    if len(texts) != 1:
      self.fail(node, f'{field}={self.file.code(arg.value)} changes over the loop; port it by hand')
    return texts.pop()
