"""Linen's lifted transforms of a user's class, written with NNX's.

    blocks = nn.scan(
        nn.remat(Block, prevent_cse=False),
        variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
        in_axes=nn.broadcast, length=config.num_layers,
        metadata_params={nn.PARTITION_NAME: 'layers'},
    )
    x, _ = blocks(config)(x, mask)

is, in NNX, a stack of `Block`s built by `nnx.vmap` over split keys (the
parameters stacked on a leading axis named as Linen names it) and a scan
over it, each layer under `nnx.remat`:

    # __init__
    @nnx.split_rngs(splits=config.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: 'layers'})
    def create_blocks(rngs: nnx.Rngs):
      return Block(config, rngs=rngs)

    self.blocks = create_blocks(rngs)

    # __call__
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0),
              transform_metadata={nnx.PARTITION_NAME: 'layers'})
    @nnx.remat(prevent_cse=False)
    def blocks(x, block):
      return block(x, mask)

    x, _ = blocks(x, self.blocks)

What this writes: `nn.scan` with every variable collection on axis 0,
`params` split, the arguments after the carry broadcast (`in_axes=nn.broadcast`),
a `length`; `nn.remat` under it or alone, with `prevent_cse`, `policy` or
`static_argnums` (the arguments it names closed over). Of a method, Linen's
scan over its inputs (`method_scan`) and its remat (`method_remat`).
Anything else (`nn.vmap`, scanned inputs, other axes) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import libcst as cst

from converters.port import linen_transforms, references, source, syntax

_SCAN_KEYWORDS = {'variable_axes', 'split_rngs', 'in_axes', 'out_axes', 'length', 'metadata_params'}
_REMAT_KEYWORDS = {'prevent_cse', 'policy', 'static_argnums'}


class Refused(Exception):
  """A transform this module does not write: the message says what;
  `advice`, what to write in NNX (`linen_transforms`)."""

  def __init__(self, message: str, transform: str):
    super().__init__(message)
    self.transform = transform

  @property
  def advice(self) -> str:
    return linen_transforms.by_hand(self.transform)


@dataclasses.dataclass
class Lifted:
  """A user's class under `nn.scan` and/or `nn.remat`, read from its call.

  Attributes:
    target: the expression naming the user's class (`Block`).
    scan: whether it is scanned; `length`: its length's source expression;
      `partition`: the source of the name of the stacked axis, or None.
    remat: `nn.remat`'s keyword arguments (`prevent_cse=False`), or None.
  """

  target: cst.BaseExpression
  scan: bool
  length: cst.BaseExpression | None
  partition: cst.BaseExpression | None
  remat: list[cst.Arg] | None
  #: Whether the scan broadcasts the arguments after the carry
  #: (`in_axes=nn.broadcast`); Linen's default scans over them.
  broadcast: bool = False
  #: `nn.remat`'s `static_argnums`: the module is argument 0, its first
  #: input 1.
  static_argnums: tuple[int, ...] = ()
  #: The remat a scanned local is bound to (`block = nn.remat(Block)`), a
  #: statement the port leaves out as it does the scan's.
  through: cst.Call | None = None


def _keywords(call: cst.Call, allowed: set[str], what: str) -> dict[str, cst.BaseExpression]:
  values = {}
  for arg in call.args[1:]:
    if arg.keyword is None or arg.star:
      raise Refused(f'{what} with arguments other than keywords after the module', what.removeprefix('nn.'))
    if arg.keyword.value not in allowed:
      raise Refused(f'{what}(..., {arg.keyword.value}=...)', what.removeprefix('nn.'))
    values[arg.keyword.value] = arg.value
  return values


def lifted(call: cst.Call, file: source.SourceFile,
           bound: Mapping[str, cst.BaseExpression | None] = MappingProxyType({})) -> Lifted | None:
  """`call` read as a lifted transform of a class, None if it is no
  `nn.scan` / `nn.remat` call; raises `Refused` for one this does not write.
  A scan of a local (`nn.scan(block, ...)`) reads the remat it is `bound` to
  (`block = nn.remat(Block, ...)`, big_vision's)."""
  def transform_of(node) -> str | None:
    return references.linen_transform(node, file) if isinstance(node, cst.Call) else None

  kind = transform_of(call)
  if kind is None:
    return None
  if kind not in ('scan', 'remat', 'checkpoint'):
    raise Refused(f'nn.{kind} of a module', kind)
  if not call.args or call.args[0].keyword is not None:
    raise Refused(f'nn.{kind} without the module as its first argument', kind)
  scan = kind == 'scan'
  length = partition = None
  remat = None
  broadcast = False
  inner = call
  through = None
  if scan:
    keywords = _keywords(call, _SCAN_KEYWORDS, 'nn.scan')
    _check_scan(keywords, file)
    length = keywords.get('length')
    if length is None:
      raise Refused('nn.scan without length=', 'scan')
    partition = _partition(keywords.get('metadata_params'), file)
    broadcast = 'in_axes' in keywords
    inner = call.args[0].value
    if isinstance(inner, cst.Name) and transform_of(bound.get(inner.value)) in ('remat', 'checkpoint'):
      inner = through = bound[inner.value]
    if transform_of(inner) is not None:
      if transform_of(inner) not in ('remat', 'checkpoint'):
        raise Refused(f'nn.scan of nn.{transform_of(inner)}', transform_of(inner))
    else:
      return Lifted(inner, True, length, partition, None, broadcast)
  if not inner.args or inner.args[0].keyword is not None:
    raise Refused('nn.remat without the module as its first argument', 'remat')
  static = _static_argnums(_keywords(inner, _REMAT_KEYWORDS, 'nn.remat').get('static_argnums'))
  # The function NNX's remat runs closes over the module's static arguments:
  # constants of it, as `static_argnums` made them of Linen's.
  remat = [arg for arg in inner.args[1:] if arg.keyword.value != 'static_argnums']
  target = inner.args[0].value
  if transform_of(target) is not None:
    raise Refused('nn.remat of a transformed module', 'remat')
  return Lifted(target, scan, length, partition, remat, scan and broadcast, static, through)


def _static_argnums(value: cst.BaseExpression | None) -> tuple[int, ...]:
  """`static_argnums=(2,)` (or `2`) as `(2,)`; raises `Refused` for one
  not written as numbers."""
  if value is None:
    return ()
  elements = [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
  if not all(isinstance(e, cst.Integer) for e in elements):
    raise Refused('nn.remat with static_argnums not written as numbers', 'remat')
  return tuple(int(e.value) for e in elements)


def _check_scan(keywords: dict, file: source.SourceFile) -> None:
  axes = keywords.get('variable_axes')
  if not isinstance(axes, cst.Dict) or not axes.elements:
    raise Refused('nn.scan without variable_axes={...: 0}', 'scan')
  for element in axes.elements:
    if not (isinstance(element, cst.DictElement) and isinstance(element.value, cst.Integer)
            and element.value.value == '0'):
      raise Refused('nn.scan with a variable axis other than 0', 'scan')
  if _split_rngs(keywords.get('split_rngs')).get('params') != 'True':
    raise Refused("nn.scan without split_rngs={'params': True} (layers initialised alike)", 'scan')
  in_axes = keywords.get('in_axes')
  if in_axes is not None and not references.is_linen(in_axes, file, 'broadcast'):
    raise Refused('nn.scan over inputs (in_axes other than nn.broadcast)', 'scan')
  out_axes = keywords.get('out_axes')
  if out_axes is not None and not (isinstance(out_axes, cst.Integer) and out_axes.value == '0'):
    raise Refused('nn.scan with out_axes other than 0', 'scan')


def _split_rngs(split: cst.BaseExpression | None) -> dict[str, str]:
  """`split_rngs={'params': True}` as `{'params': 'True'}`: each stream
  spelled out in the dict and the code of its value; `{None: ...}` for an
  entry that is not a string key (a splat, a variable), `{}` for no dict."""
  if not isinstance(split, cst.Dict):
    return {}
  return {
      (e.key.evaluated_value if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) else None):
      (cst.Module([]).code_for_node(e.value) if isinstance(e, cst.DictElement) else '')
      for e in split.elements
  }


def _partition(metadata: cst.BaseExpression | None, file: source.SourceFile):
  if metadata is None:
    return None
  if not (isinstance(metadata, cst.Dict) and len(metadata.elements) == 1
          and isinstance(metadata.elements[0], cst.DictElement)
          and references.is_linen(metadata.elements[0].key, file, 'PARTITION_NAME')):
    raise Refused('nn.scan with metadata_params other than {nn.PARTITION_NAME: ...}', 'scan')
  return metadata.elements[0].value


def _metadata(partition) -> str:
  if partition is None:
    return ''
  code = cst.Module([]).code_for_node(partition)
  return f', transform_metadata={{nnx.PARTITION_NAME: {code}}}'


def creation(lift: Lifted, function: str, creation_call: cst.Call) -> cst.FunctionDef:
  """The `__init__` function making the module (a stack of them, scanned)."""
  body = cst.IndentedBlock([cst.SimpleStatementLine([cst.Return(creation_call)])])
  code = cst.Module([]).code_for_node
  decorators = []
  if lift.scan:
    decorators = [
        cst.Decorator(syntax.expression(f'nnx.split_rngs(splits={code(lift.length)})')),
        cst.Decorator(syntax.expression(
            f'nnx.vmap(in_axes=(0,), out_axes=0{_metadata(lift.partition)})')),
    ]
  return cst.FunctionDef(
      name=cst.Name(function),
      params=cst.Parameters([cst.Param(cst.Name('rngs'), annotation=cst.Annotation(syntax.expression('nnx.Rngs')))]),
      body=body, decorators=decorators,
  )


def call_function(lift: Lifted, function: str, carry: str, module: str, call: cst.Call,
                  passed: Sequence[tuple[str, cst.BaseExpression, bool]] = ()) -> cst.FunctionDef:
  """The `__call__` function running the module: `nnx.scan` over the stack
  (`carry` carried, the module's other arguments closed over), each layer
  under `nnx.remat` if Linen's was; the module alone under `nnx.remat`,
  its first input `carry` passed if given (not a loop's name closed over),
  and the arguments `passed` (`(parameter, value, static)`: read off a loop
  around the call) after the module, static ones in `static_argnums`."""
  decorators = []
  if lift.scan:
    decorators.append(cst.Decorator(syntax.expression(
        f'nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0){_metadata(lift.partition)})')))
  if lift.remat is not None:
    # On one line: the decorator is no longer the multi-line call Linen's was.
    arguments = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in lift.remat]
    static = tuple(2 + k for k, (_, _, is_static) in enumerate(passed) if is_static)
    if static:
      arguments.append(cst.Arg(syntax.expression(repr(static)), keyword=cst.Name('static_argnums'),
                               equal=cst.AssignEqual(cst.SimpleWhitespace(''), cst.SimpleWhitespace(''))))
    remat = cst.Call(syntax.expression('nnx.remat'), syntax.normalised(arguments)) if arguments \
        else syntax.expression('nnx.remat')
    decorators.append(cst.Decorator(remat))
  params = [cst.Param(cst.Name(carry)), cst.Param(cst.Name(module))] if carry else [cst.Param(cst.Name(module))]
  params += [cst.Param(cst.Name(name)) for name, _, _ in passed]
  return cst.FunctionDef(
      name=cst.Name(function), params=cst.Parameters(params),
      body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Return(call)])]),
      decorators=decorators,
  )


#: `nn.scan`'s keywords a scan over a method's inputs may have, and NNX's
#: `nnx.scan` takes as they are.
_METHOD_SCAN_KEYWORDS = {'variable_broadcast', 'split_rngs', 'in_axes', 'out_axes', 'length', 'reverse', 'unroll'}


def is_method_scan(decorator: cst.Decorator, file: source.SourceFile) -> bool:
  """Whether `decorator` is `functools.partial(nn.scan, ...)` (or of
  `nn.transforms.scan`): Linen's scan of the method it decorates."""
  node = decorator.decorator
  if not (isinstance(node, cst.Call) and references.dotted(node.func) in (['functools', 'partial'], ['partial'])
          and node.args and node.args[0].keyword is None):
    return False
  target = node.args[0].value
  return file.linen_path(target) in (('scan',), ('transforms', 'scan'))


def decorating_transform(decorator: cst.Decorator, file: source.SourceFile) -> str | None:
  """The name of the Linen lifted transform `decorator` applies (`nn.jit`,
  `nn.vmap(...)`, `functools.partial(nn.vmap, ...)`), else None."""
  node = decorator.decorator
  if (isinstance(node, cst.Call) and references.dotted(node.func) in (['functools', 'partial'], ['partial'])
      and node.args and node.args[0].keyword is None):
    node = node.args[0].value
  return references.linen_transform(node, file)


_REMAT_PATHS = (('remat',), ('checkpoint',), ('transforms', 'remat'), ('transforms', 'checkpoint'))


def is_method_remat(decorator: cst.Decorator, file: source.SourceFile) -> bool:
  """Whether `decorator` is Linen's remat of the method it decorates:
  `nn.remat` (`nn.checkpoint`), or `functools.partial` of it."""
  node = decorator.decorator
  if isinstance(node, cst.Call) and references.dotted(node.func) in (['functools', 'partial'], ['partial']) \
      and node.args and node.args[0].keyword is None:
    node = node.args[0].value
  return file.linen_path(node) in _REMAT_PATHS


def method_remat(decorator: cst.Decorator, linen: cst.FunctionDef, ported: cst.FunctionDef) -> cst.Decorator:
  """Linen's remat of a method as NNX's (`nnx.remat`, its keywords kept),
  which counts the module as argument 0 too: `static_argnums` name the
  arguments of `linen` they named, numbered in `ported`'s signature (one
  the port dropped, a mode flag, named no more)."""
  node = decorator.decorator
  keywords = _keywords(node, _REMAT_KEYWORDS, 'nn.remat of a method') if isinstance(node, cst.Call) else {}
  static = _static_argnums(keywords.pop('static_argnums', None))
  names = [p.name.value for p in linen.params.params]
  if any(i >= len(names) for i in static):
    raise Refused('nn.remat of a method with static_argnums past its positional arguments', 'remat')
  kept = [p.name.value for p in ported.params.params]
  renumbered = [kept.index(names[i]) for i in static if names[i] in kept]
  code = cst.Module([]).code_for_node
  arguments = [f'{name}={code(value)}' for name, value in keywords.items()]
  if renumbered:
    arguments.append(f'static_argnums={syntax.tuple_source(str(i) for i in renumbered)}')
  return cst.Decorator(syntax.expression(f'nnx.remat({", ".join(arguments)})' if arguments else 'nnx.remat'))


def method_scan(decorator: cst.Decorator, method: cst.FunctionDef, file: source.SourceFile) -> cst.Decorator:
  """Linen's scan of a method over its inputs, its parameters broadcast
  (`functools.partial(nn.scan, variable_broadcast='params', split_rngs=
  {'params': False}, in_axes=1, out_axes=1)`), as NNX's: `nnx.scan(in_axes=
  (None, nnx.Carry, 1), out_axes=(nnx.Carry, 1))`, the module itself
  broadcast (`None`), the first argument carried. Raises `Refused` for
  anything else (variables stacked or carried, keys split per step)."""
  keywords = _keywords(decorator.decorator, _METHOD_SCAN_KEYWORDS, 'nn.scan of a method')
  broadcast = keywords.pop('variable_broadcast', None)
  names = [e.value for e in broadcast.elements] if isinstance(broadcast, (cst.List, cst.Tuple)) else [broadcast]
  if broadcast is None or not all(
      isinstance(name, cst.SimpleString) and name.evaluated_value == 'params' for name in names):
    raise Refused("nn.scan of a method without variable_broadcast='params' (parameters per step)", 'scan')
  split = keywords.pop('split_rngs', None)
  if split is not None and _split_rngs(split) not in ({}, {'params': 'False'}):
    raise Refused("nn.scan of a method splitting keys per step (split_rngs other than {'params': False})", 'scan')
  params = method.params
  if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.kwonly_params or params.star_kwarg \
      or params.posonly_params or any(p.default is not None for p in params.params):
    raise Refused('nn.scan of a method taking other than positional arguments without defaults', 'scan')
  scanned = len(params.params) - 2  # after `self` and the carry
  if scanned < 0:
    raise Refused('nn.scan of a method without a carry', 'scan')
  code = cst.Module([]).code_for_node

  def axis(node) -> str:
    if references.is_linen(node, file, 'broadcast'):
      return 'None'
    value = node.expression if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
        else node
    if not isinstance(value, cst.Integer):
      raise Refused(f'nn.scan of a method with the axis {code(node)} (not a number or nn.broadcast)', 'scan')
    return code(node)

  in_axes = keywords.pop('in_axes', None)
  if isinstance(in_axes, cst.Tuple):
    if len(in_axes.elements) != scanned:
      raise Refused('nn.scan of a method whose in_axes do not name each argument after the carry', 'scan')
    axes = [axis(e.value) for e in in_axes.elements]
  else:
    axes = [axis(in_axes) if in_axes is not None else '0'] * scanned
  out_axes = keywords.pop('out_axes', None)
  if isinstance(out_axes, cst.Tuple):  # one axis per output: `(1, nn.broadcast)` -> `(1, None)`
    out = syntax.tuple_source(axis(e.value) for e in out_axes.elements)
  else:
    out = axis(out_axes) if out_axes is not None else '0'
  rest = ''.join(f', {name}={code(value)}' for name, value in keywords.items())
  return cst.Decorator(syntax.expression(
      f'nnx.scan(in_axes=({", ".join(["None", "nnx.Carry", *axes])}), out_axes=(nnx.Carry, {out}){rest})'))
