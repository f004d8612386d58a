"""The NNX expression creating the modules of one creation site: a Flax
layer as its NNX counterpart (`nnx.Linear(in_size, features, rngs=rngs)`,
its input size read off the inputs, its mode arguments left to the NNX
mode, Linen's defaults NNX does not share written out), a module of the
user's as its port (the sizes its constructor takes), a helper's call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from flax import linen as nn

from converters.port import (
  factories,
  helpers,
  input_reads,
  layers,
  references,
  syntax,
  tracing,
)

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter


class Creations:
  """The creations of one class, for its `ClassWriter`, which holds the
  sites and what they are made through."""

  def __init__(self, writer: ClassWriter):
    self.writer = writer
    self.file, self.fail = writer.file, writer.fail

  def creation(self, site: tracing.Site) -> cst.BaseExpression:
    """The NNX expression creating the modules of `site`."""
    node, children = self.writer.sites[site]
    child = children[0]
    spec = layers.layer_spec(child.cls)
    if site in self.writer.helpers:
      size = None
      if self.writer.helpers[site].size_parameter is not None:
        size = self.writer.sizes.in_size(site, node, self.writer.sizes.feature_axis_of(node))
      for arg in node.args:
        if self.writer.call_time & syntax.names_in(arg.value):
          self.fail(node, f'{self.file.code(arg.value)} depends on the inputs of the call; port it by hand')
      return self.writer.helpers[site].call(node, size)
    func = self.writer.partials.expanded(node).func
    # Made through what the model is configured with (a field) or through a
    # partial `__init__` keeps: written through it, as the traced layer
    # takes its arguments (the rest is in the partial).
    through = self.writer.partials.field_factory(node, func, children) is not None or (
        isinstance(func, cst.Name) and func.value in self.writer.partials.kept)
    if not through and site not in self.writer.lifts:
      # Written as the traced class: the callee must name that class (not
      # a module class the configuration holds, `self.config.norm`, nor one
      # computed, `getattr(nn, self.kind)`), or the port is right for the
      # traced configuration only.
      named = factories.factory_class(self.writer.callees.target(func))
      if named is not child.cls:
        self.fail(node, f'{self.file.code(func)}(...) makes {child.cls.__name__} in the traced configuration '
                  'only (a module class the configuration holds, or one computed); port it by hand')
    arguments = self.writer.arguments.of(node, child.cls)
    if spec is not None:
      return self._layer(site, node, spec, arguments, func if through else None)
    if child.cls in self.writer.child_ports:
      return self._module(site, node, arguments)
    if layers.is_flax_class(child.cls):
      self.fail(node, f'Flax\'s {child.cls.__name__} has no NNX counterpart the port knows; port it by hand')
    self.fail(node, f'{child.cls.__name__} could not be ported; see its own entry')

  def _layer(self, site, node, spec: layers.LayerSpec, arguments,
                      through: cst.BaseExpression | None = None) -> cst.BaseExpression:
    nnx_params = spec.nnx_parameters()
    args: list[cst.Arg] = []
    kv_size = None
    if spec.in_features is not None:
      in_size = self.writer.sizes.in_size(site, node, self.writer.sizes.feature_axis_of(node))
      if spec.in_features_first():
        args.append(cst.Arg(syntax.expression(in_size)))
      if spec.kv_features is not None:
        kv_size = self.writer.sizes.kv_size(site, node, spec)
    positional = True
    expected = [p for p in spec.nnx_positional() if p != spec.in_features]
    for i, (field, arg) in enumerate(arguments):
      if field == 'name':
        continue
      if field == '**':  # a choice between two dicts of arguments, NNX's names for Linen's
        args.append(arg.with_changes(value=self._chosen_layer_arguments(node, spec, arg.value)))
        positional = False
        continue
      if field in dict(spec.mode):
        self.writer.mode_flags.record(arg.value, dict(spec.mode)[field], node)
        positional = False
        continue
      if field == spec.sequence_field:
        args += self._sequence_arguments(site, node, arg)
        positional = False
        continue
      name = spec.nnx_argument(field)
      if name not in nnx_params:
        self.fail(node, f'{spec.nnx} has no argument {name!r} for Linen\'s {field!r}; port it by hand')
      if field in dict(spec.module_fields):
        inner = arg.value
        if inner not in self.writer.node_sites:
          self.fail(node, f'{field}= of {spec.nnx} takes a module created in place; port it by hand')
        self.writer.inlined[self.writer.node_sites[inner]] = (site, (dict(spec.module_fields)[field],))
        arg = arg.with_changes(value=self.creation(self.writer.node_sites[inner]))
        keep_position = positional and arg.keyword is None and i < len(expected) and expected[i] == name
        positional = positional and keep_position
        args.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
                    if keep_position else syntax.keyword(name, arg.value))
        continue
      if self.writer.call_time & syntax.names_in(arg.value):
        # A size read from the inputs (`x.shape[-1]`) is one NNX knows when it
        # builds: the inputs' sizes are arguments of the constructor. As
        # written where it reads them plainly (`in_features if out_dim is None
        # else out_dim`, big_vision's `mlp_dim or 4 * in_features`: right for
        # every value of `out_dim`), else as traced.
        rewritten = input_reads.without_input_reads(self.writer, arg.value)
        if rewritten is not None and any(isinstance(n, (cst.IfExp, cst.BooleanOperation))
                                         for n in syntax.descendants(rewritten)):
          # A choice on the configuration the trace took one side of: as written.
          traced = rewritten.with_changes(lpar=[], rpar=[]) if getattr(rewritten, 'lpar', None) else rewritten
        else:
          traced = syntax.expression(self.writer.sizes.input_size_argument(site, node, field, arg))
        arg = arg.with_changes(value=traced)
      keep_position = positional and arg.keyword is None and i < len(expected) and expected[i] == name
      if not keep_position:
        positional = False
      args.append(
          arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
          if keep_position else syntax.keyword(name, arg.value)
      )
    if spec.in_features is not None and not spec.in_features_first():
      args.append(syntax.keyword(spec.in_features, syntax.expression(in_size)))
    if kv_size is not None and kv_size != in_size:  # cross-attention: keys of another width
      args.append(syntax.keyword(spec.kv_features, syntax.expression(kv_size)))
    given = {f for f, _ in arguments} | self.writer.partials.given_by_kept(node) | {
        e.key.evaluated_value for f, a in arguments if f == '**' for side in (a.value.body, a.value.orelse)
        for e in side.elements}
    from_field = through is not None and not isinstance(through, cst.Name)
    for field in spec.linen_defaults:
      # (A field's partial may set it: what it holds is the configuration's.)
      if field not in given and not from_field:
        args.append(syntax.keyword(spec.nnx_argument(field), syntax.expression(repr(spec.linen_default(field)))))
    if spec.rngs:
      args.append(syntax.keyword('rngs', cst.Name('rngs')))
    return cst.Call(through if through is not None else syntax.expression(spec.written), syntax.normalised(args))

  def _chosen_layer_arguments(self, node: cst.Call, spec: layers.LayerSpec, choice: cst.IfExp) -> cst.IfExp:
    """`CreationArguments._chosen`'s choice with NNX's names for the layer's Linen
    arguments; refused where a key is not a plain argument of both layers,
    or sets one whose default the port writes (NNX's differs from Linen's)
    on one side only."""
    sides = [{e.key.evaluated_value: e.value for e in side.elements} for side in (choice.body, choice.orelse)]
    for field in set(sides[0]) | set(sides[1]):
      plain = (field not in dict(spec.mode) and field != spec.sequence_field and field not in dict(spec.module_fields)
               and spec.nnx_argument(field) in spec.nnx_parameters())
      if not plain or any(self.writer.call_time & syntax.names_in(side[field]) for side in sides if field in side):
        self.fail(node, f'{self.file.code(choice)} chooses {field!r}, which {spec.nnx} does not take as a plain '
                  'argument of the configuration (a mode, a module, a size read from the inputs, or no '
                  'counterpart); give it as a keyword, or port it by hand')
      if field in spec.linen_defaults and not all(field in side for side in sides):
        self.fail(node, f'{field!r} is given on one side of {self.file.code(choice)} only, and NNX\'s default '
                  f'for it is not Linen\'s: give it on both sides, or port it by hand')
    body, orelse = (
        cst.Dict([cst.DictElement(cst.SimpleString(repr(spec.nnx_argument(k))), v) for k, v in side.items()])
        for side in sides)
    parens = {} if choice.lpar else {'lpar': [cst.LeftParen()], 'rpar': [cst.RightParen()]}
    return choice.with_changes(body=body, orelse=orelse, **parens)

  def _sequence_arguments(self, site, node, arg: cst.Arg) -> list[cst.Arg]:
    """`nn.Sequential([nn.Dense(8), nn.relu, Block()])`'s list as NNX takes
    it, one argument each: modules created in place (written here, held at
    `layers/<position>`), and functions as NNX spells them."""
    if not isinstance(arg.value, (cst.List, cst.Tuple)) or any(
        isinstance(e, cst.StarredElement) for e in arg.value.elements):
      self.fail(node, f'{self.file.code(arg.value)}: the port writes a Sequential of a list written out '
                '(nn.Sequential([nn.Dense(8), nn.relu])); write it so, or port it by hand')
    args = []
    for position, element in enumerate(arg.value.elements):
      value = element.value
      if value in self.writer.node_sites:
        self.writer.inlined[self.writer.node_sites[value]] = (site, ('layers', position))
        args.append(cst.Arg(self.creation(self.writer.node_sites[value])))
      elif isinstance(value, cst.Call) and self._calls_a_module(value):
        self.fail(value, f'{self.file.code(value)} in a Sequential makes a module the trace did not see '
                  'made there; port it by hand')
      elif local := (syntax.names_in(value) - syntax.bound_in(value)) & syntax.bound_in(self.writer.method):
        # `d` made before the list, a lambda reading a local of the call:
        # NNX builds the Sequential in `__init__`, where neither is.
        self.fail(value, f'{self.file.code(value)} in a Sequential reads {", ".join(sorted(local))}, a local '
                  'of the method (write each module in the list where it is made, and functions of '
                  'their inputs only); port it by hand')
      else:
        args.append(cst.Arg(value.visit(references.LinenReferences(
            self.file, self.writer.cls, strict=True, bound=syntax.bound_in(self.writer.method)))))
    return args

  def _calls_a_module(self, call: cst.Call) -> bool:
    made = helpers.layer_class(self.file, call.func)
    return isinstance(made, type) and issubclass(made, nn.Module)

  def _made_module(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`self.<attribute>` of the module `value` makes in place or names (a
    local of the method bound to one creation), which the class holds; None
    where it is neither."""
    value = self.writer.creation_named(value) or value
    site = self.writer.node_sites.get(value) if isinstance(value, cst.Call) else None
    if site is None or site not in self.writer.attributes:
      return None
    attribute, is_list = self.writer.attributes[site]
    if is_list:
      self.fail(value, 'a module made in a loop handed to another as an argument; port it by hand')
    return syntax.expression(f'self.{attribute}')

  def _module(self, site, node, arguments) -> cst.BaseExpression:
    _, children = self.writer.sites[site]
    port = self.writer.child_ports[children[0].cls]
    # Fields the child's port takes as its mode leave the creation (NNX's
    # model.train() / .eval() reach every submodule); the rest keep their
    # order, as the port's constructor keeps the fields'.
    args = []
    handed = set(self.writer.handed.values())
    from_inputs = set()  # the arguments computed from the inputs' sizes, as `__init__` has them
    for field, arg in arguments:
      if field == '**':
        if port.field_modes:
          self.fail(node, f'{self.file.code(arg.value)} hands {port.cls.__name__} its fields by name, and the '
                    f'NNX mode replaces its {", ".join(port.field_modes)}; port it by hand')
        args.append(arg)
      elif field in port.field_modes:
        self.writer.mode_flags.record(arg.value, not port.field_modes[field], node)
      elif arg.value in handed:
        args.append(arg.with_changes(value=self.writer.partials.nnx_handed(arg.value)))  # `nn.Dense` -> `nnx.Linear`
      elif (made := self._made_module(arg.value)) is not None:
        args.append(arg.with_changes(value=made))  # `emb=nn.Embed(11, 4)`, `emb=emb`: the NNX module
      elif field != 'name' and self.writer.call_time & syntax.names_in(arg.value):
        # `FinalLayer(patch, out_channels)` with `out_channels = x.shape[-1]
        # * 2`: the inputs' sizes it reads are the constructor's.
        rewritten = input_reads.without_input_reads(self.writer, arg.value)
        if rewritten is not None:
          from_inputs.add(field)
          if getattr(rewritten, 'lpar', None):
            rewritten = rewritten.with_changes(lpar=[], rpar=[])
          args.append(arg.with_changes(value=rewritten))
        else:
          args.append(arg)
      elif field != 'name':
        args.append(arg)
    # A flag inside a field the child takes (`config.deterministic`): the
    # mode of this class too, through the field it hands on.
    given = dict(arguments)
    for mode, train_value in port.field_modes.items():
      field, _, rest = mode.partition('.')
      if not rest:
        continue
      path = self.writer.field_path(given[field].value) if field in given else None
      if path is None:
        self.fail(node, f'{children[0].cls.__name__} takes its mode from {mode}, which this class '
                  'does not hand it from its own configuration; port it by hand')
      if self.writer.mode_flags.fields.setdefault(f'{path}.{rest}', train_value) != train_value:
        self.fail(node, f'{path}.{rest} sets modes both ways; port it by hand')
    for field, arg in arguments:
      if field != 'name' and field not in port.field_modes and arg.value not in handed and (
          field not in from_inputs) and (self.writer.call_time & syntax.names_in(arg.value)):
        self.fail(
            node,
            f'{field}={self.file.code(arg.value)} depends on the inputs of the call; port it by hand',
        )
    for parameter in port.inputs:
      if not parameter.whole_shape:
        size = self.writer.sizes.in_size(site, node, lambda child: -1, parameter.index)
        args.append(syntax.keyword(parameter.name, syntax.expression(size)))
        continue
      texts: dict[str, list[tracing.Created]] = {}  # the shape -> the instances that give it
      for child in children:
        symbolic = self.writer.sizes.symbolic_child(child)
        shape = symbolic.calls[0].args[parameter.index].shape
        shape = shape if parameter.with_batch else shape[1:]
        text = syntax.tuple_source(self.writer.sizes.child_size(symbolic, d) for d in shape)
        texts.setdefault(text, []).append(child.parent)
      sizes = self.writer.sizes
      read = sizes.input_names(node, parameter.index)
      text = next(iter(texts)) if len(texts) == 1 else sizes.switched(node, texts, read)
      if text is None:
        self.fail(node, f'the input sizes of {port.cls.__name__} change over the loop; port it by hand')
      args.append(syntax.keyword(parameter.name, syntax.expression(text)))
    args.append(syntax.keyword('rngs', cst.Name('rngs')))
    func = self.writer.lifts[site][0].target if site in self.writer.lifts else self.writer.partials.expanded(node).func
    if isinstance(func, cst.Attribute) and helpers.layer_class(self.file, func) is port.cls:
      func = cst.Name(port.cls.__name__)  # `layers.Block(...)`: the port written beside this one
    return cst.Call(func, syntax.normalised(args))
