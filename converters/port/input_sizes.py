"""The sizes a port's constructor reads off its inputs and its layers: the
input size of each creation site of a class, written as one expression of
the fields and inputs, a running variable over a loop (`running_sizes`), a
size an `if` on the configuration switches (`switched_sizes`), or the output
size of the layer made before it (`chained_sizes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import (
  chained_sizes,
  count_fits,
  layers,
  running_sizes,
  shapes,
  switched_sizes,
  syntax,
  tracing,
)

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
    #: A loop (by id) -> (the initial size, the running variable): `running_sizes`.
    self.running: dict[int, tuple[str, str]] = {}

  def use_input_dim(self, index: int, dim: int) -> None:
    """The constructor takes dimension `dim` of array input `index`."""
    array = self.writer.instance.calls[0].args[index]
    name = self.writer.params[index] if index < len(self.writer.params) else f'arg{index}'
    self.used_dims.add(shapes.InputDim(index, name, dim, len(array.shape), array.shape[dim]))

  def size_source(self, value, table: shapes.SymbolTable | None = None) -> str:
    if isinstance(value, count_fits.Unfitted):
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

  @classmethod
  def readable_placeholder(cls, origin) -> str:
    """An input's dimension as its call reads it (`x.shape[1]`), for messages."""
    if isinstance(origin, shapes.InputDim):
      return f'{origin.name}.shape[{origin.dim - origin.ndim if origin.dim == origin.ndim - 1 else origin.dim}]'
    return cls.origin_placeholder(origin)

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
      value = self._kernel_in_size(child, symbolic, spec)
      if value is None:
        if not symbolic.calls:
          self.fail(node, f'{child.name} is never called on the traced inputs, so its input size is '
                    'unknown; port it by hand')
        if spec is not None and index == 0:
          index = spec.input_index
        inputs = symbolic.calls[0].args  # (those given by keyword too: `tracing.MethodCall`)
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
    running = running_sizes.running_size(self, node, first, values, uniform=len({str(v) for _, v in sizes}) == 1)
    if running is not None:
      return running
    texts = {self.child_size(symbolic, value) for symbolic, value in sizes}
    if len(texts) == 1:
      return texts.pop()
    by_size: dict[str, list[tracing.Created]] = {}
    for child, (symbolic, value) in zip(children, sizes):
      by_size.setdefault(self.child_size(symbolic, value), []).append(child.parent)
    switched = self.switched(node, by_size, self.input_names(node, index))
    if switched is not None:
      return switched
    chained = chained_sizes.chained_size(self, node, children, sizes)
    if chained is not None:
      return chained
    self.fail(node, f'the input size of {children[0].cls.__name__} changes from one creation to the '
              'next in a way the port cannot write; port it by hand')

  def _kernel_in_size(self, child: tracing.Created, symbolic: tracing.Created, spec: layers.LayerSpec | None):
    """The input size of a layer called inside a transform only (an RNN's
    cell), which its kernel says; None for any other."""
    if symbolic.calls or spec is None or not spec.in_from_kernel:
      return None
    kernel = self.writer.symbolic_of(child.parent).variables.get('params', {}).get(child.name, {})
    for key in spec.in_from_kernel:
      kernel = kernel.get(key, {}) if isinstance(kernel, dict) else {}
    return kernel.shape[0] if hasattr(kernel, 'shape') else None

  def switched(self, node, sizes: dict[str, list[tracing.Created]], read: set[str] | None) -> str | None:
    """The size an `if` on the configuration before `node` switches
    (`switched_sizes`), read from the names `read` where known; None where
    none does."""
    writer = self.writer
    return switched_sizes.switched_size(self.file, writer.method, node, sizes, writer.call_time, writer.field_names,
                                        read)

  def input_names(self, node, index: int) -> set[str] | None:
    """The names input `index` of the module `node` creates is read from,
    where the creation is called at once (`Encoder(...)(x)`); else None."""
    call = next(iter(self.file.ancestors(node)), None)
    if not isinstance(call, cst.Call) or call.func is not node:
      return None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return syntax.names_in(positional[index].value) if index < len(positional) else None

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
      if isinstance(value, count_fits.Unfitted):
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
    """The source of a layer's size argument computed from the call's inputs
    (`features=x.shape[-1]`): one expression for every creation, or the
    two an `if` on the configuration switches (`switched`)."""
    by_size: dict[str, list[tracing.Created]] = {}
    traced = []  # (symbolic child, size), read as the source reads it only to refuse
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
      by_size.setdefault(self.child_size(symbolic, value), []).append(child.parent)
      traced.append((symbolic, value))
    if len(by_size) == 1:
      return next(iter(by_size))
    switched = self.switched(node, by_size, syntax.names_in(arg.value) - {'self'})
    if switched is not None:
      return switched
    readable = {self.tables[id(symbolic)].source(value, self.readable_placeholder) for symbolic, value in traced}
    sizes = ', '.join(f'`{t}`' for t in sorted(readable))
    parents = [id(parent) for instances in by_size.values() for parent in instances]
    where = ('over the iterations of a loop' if len(set(parents)) < len(parents) else  # one instance, two creations
             'at the configurations traced, and no `if` on the configuration alone before it decides which')
    self.fail(node, f'{field}={self.file.code(arg.value)} is {sizes} {where}; one NNX layer is built at one '
              'size: port it by hand')

