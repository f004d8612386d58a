"""The decode cache, made where NNX makes it: `init_cache`.

Linen makes a decode cache in the `init` call of a model built with
`decode=True`: each attention layer's keys and values for the inputs `init`
was given (`(*batch, max_length, features)`), and the index variables a
module makes itself (`self.variable('cache', 'cache_index', ...)`). NNX
makes it when asked, after the model is built: `nnx.MultiHeadAttention`
has `init_cache(input_shape, dtype)`, and Flax's own NNX ports (lm1b) give
every module holding a cache the same method. The port does the same. Each
class whose layers hold a cache gets

    def init_cache(self, input_shape: tuple[int, ...], dtype=None) -> None:
      self.cache_index = nnx.Cache(jnp.array(0, jnp.uint32))  # its own
      if self.attention.decode:                                # a layer's
        self.attention.init_cache(input_shape, dtype or self.attention.dtype)
      for block in self.blocks:                                # a list's
        block.init_cache(input_shape, dtype)

under the conditions `__init__` builds those layers under, and a stack made
by `nnx.vmap` gets its caches by the same vmap. The class's own cache
variables leave `__init__` for it, so that calling it again starts a new
sequence (a cache made in `__init__` would keep its index). `input_shape`
is that of the attention layers' inputs, as `nnx.MultiHeadAttention` and
Flax's lm1b port take it: one batch and length for every layer (the width
is each layer's own). NNX's attention makes a cache whether it decodes or
not: it is asked only where it decodes, as Linen's makes one only then.
"""

from __future__ import annotations

import libcst as cst
from flax import linen as nn

from converters.port import references, syntax

def cache_attributes(writer) -> dict[str, bool]:
  """The attributes of `writer`'s class holding layers that have a decode
  cache: attention layers built to decode (True), the user's classes whose
  port has `init_cache` (False)."""
  found = {}
  for site, (node, children) in writer.sites.items():
    cls = children[0].cls
    if cls in writer.child_ports:
      holds = writer.child_ports[cls].has_cache
    elif isinstance(cls, type) and issubclass(cls, nn.MultiHeadDotProductAttention):
      decode = None if site in writer.helpers else syntax.keyword_value(writer.partials.expanded(node), 'decode')
      # Through a helper the argument is not read: the layer may decode.
      holds = site in writer.helpers or not (decode is None or (
          isinstance(decode, cst.Name) and decode.value == 'False'))
    else:
      holds = False
    if holds and site in writer.attributes:
      found[writer.attributes[site][0]] = cls not in writer.child_ports
  return found


def _init_call(layer: str, attention: bool) -> str:
  """`layer.init_cache(...)`; for NNX's attention, whose `init_cache`
  makes a cache whether it decodes or not, only where it decodes, of its
  own dtype unless told."""
  if attention:
    return f'if {layer}.decode:\n  {layer}.init_cache(input_shape, dtype or {layer}.dtype)\n'
  return f'{layer}.init_cache(input_shape, dtype)\n'


def _indented(code: str) -> str:
  return ''.join('  ' + line + '\n' for line in code.splitlines())


def _assigned_attribute(statement) -> tuple[str, cst.BaseExpression] | None:
  """`('x', value)` for `self.x = value`."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1):
    return None
  attribute = syntax.self_attribute(statement.body[0].targets[0].target)
  return (attribute, statement.body[0].value) if attribute is not None else None


def _appended(node: cst.CSTNode) -> list[str]:
  """The attributes `self.x.append(...)` appends to inside `node`, in order."""
  found: list[str] = []

  class Visitor(cst.CSTVisitor):
    def visit_Call(self, call):
      dotted = references.dotted(call.func)
      if dotted and len(dotted) == 3 and dotted[0] == 'self' and dotted[2] == 'append':
        found.append(dotted[1])

  node.visit(Visitor())
  return list(dict.fromkeys(found))


def _singular(attribute: str, used: set[str]) -> str:
  """A name for one layer of the list or stack `attribute`: `blocks` -> `block`."""
  name = attribute[:-1] if attribute.endswith('s') and len(attribute) > 1 else 'layer'
  while name in used:
    name += '_'
  return name


class _Splitter:
  """Splits `__init__`'s statements into those it keeps and those of
  `init_cache`."""

  def __init__(self, writer, holders: dict[str, bool], own: set[str]):
    self.writer = writer
    self.holders = holders
    self.own = own
    self.stacks: dict[str, cst.FunctionDef] = {}  # create_<x> functions by name
    self.used = {'input_shape', 'dtype', 'self'} | set(writer.field_names)

  def split(self, statements) -> tuple[list, list]:
    init, cache = [], []
    for statement in statements:
      if isinstance(statement, cst.FunctionDef):
        self.stacks[statement.name.value] = statement
        init.append(statement)
      elif isinstance(statement, cst.If):
        init_body, cache_body = self.split(statement.body.body)
        orelse = statement.orelse
        init_else, cache_else = [], []
        if isinstance(orelse, cst.Else):
          init_else, cache_else = self.split(orelse.body.body)
        elif orelse is not None:  # an elif: whatever is in it stays
          init_else, cache_else = [orelse], self.split([orelse])[1]
          if cache_else:
            self.writer.fail(None, 'a decode cache made in an elif branch; port init_cache by hand')
        init += _if(statement, init_body, init_else)
        cache += _if(statement, cache_body, cache_else)
      elif isinstance(statement, cst.For):
        init.append(statement)
        for attribute in _appended(statement):
          if attribute in self.holders:
            layer = _singular(attribute, self.used)
            cache.append(syntax.statement(
                f'for {layer} in self.{attribute}:\n' + _indented(_init_call(layer, self.holders[attribute]))))
      elif (assigned := _assigned_attribute(statement)) is not None:
        attribute, value = assigned
        if attribute in self.own:
          cache.append(statement)  # made again by each init_cache, not in __init__
          continue
        init.append(statement)
        is_list = isinstance(value, cst.Call) and references.dotted(value.func) == ['nnx', 'List']
        if attribute in self.holders and is_list and value.args:
          # `nnx.List([...])` made whole (setup style): its layers one by one.
          layer = _singular(attribute, self.used)
          cache.append(syntax.statement(
              f'for {layer} in self.{attribute}:\n' + _indented(_init_call(layer, self.holders[attribute]))))
        elif attribute in self.holders and not is_list:  # an empty list's layers: by its loop
          cache += self._init_of(attribute, value)
      elif (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign)):
        init.append(statement)
        cache.append(statement)  # a local: kept if what is kept reads it
      else:
        init.append(statement)
    return init, cache

  def _init_of(self, attribute: str, value) -> list:
    """`self.x.init_cache(...)`, or for a stack `create_x(rngs)` the same
    vmap over its layers."""
    func = value.func if isinstance(value, cst.Call) else None
    if isinstance(func, cst.Name) and func.value in self.stacks:
      vmap = [d for d in self.stacks[func.value].decorators
              if (references.dotted(_called(d.decorator)) or [''])[-1] == 'vmap']
      if len(vmap) != 1:
        self.writer.fail(None, f'the stack self.{attribute} is not made by one nnx.vmap; port init_cache by hand')
      layer = _singular(attribute, self.used)
      function = f'init_{attribute}_cache'
      code = f'def {function}({layer}):\n' + _indented(_init_call(layer, self.holders[attribute]))
      definition = syntax.statement(code).with_changes(decorators=vmap)
      return [definition, syntax.statement(f'{function}(self.{attribute})\n').with_changes(
          leading_lines=[cst.EmptyLine(indent=False)])]
    return [syntax.statement(_init_call(f'self.{attribute}', self.holders[attribute]))]


def _called(decorator: cst.BaseExpression) -> cst.BaseExpression:
  return decorator.func if isinstance(decorator, cst.Call) else decorator


def _if(statement: cst.If, body: list, orelse: list) -> list:
  """`statement` with `body` and `orelse`, turned round if only `orelse`
  is left, or nothing if neither is."""
  if not body and not orelse:
    return []
  if not body:
    return [statement.with_changes(test=syntax.negated(statement.test),
                                   body=statement.body.with_changes(body=orelse), orelse=None)]
  else_block = None
  if orelse:
    else_block = (statement.orelse if isinstance(statement.orelse, cst.Else) else cst.Else(cst.IndentedBlock([])))
    else_block = else_block.with_changes(body=else_block.body.with_changes(body=orelse))
  return [statement.with_changes(body=statement.body.with_changes(body=body), orelse=else_block)]


def _kept(statements: list, candidates: set[int]) -> list:
  """`statements` without the locals (`candidates`) nothing kept reads,
  at any depth."""
  def prune(block: list, needed: set[str]) -> list:
    out = []
    for statement in reversed(block):
      if id(statement) in candidates:
        targets = {n for t in statement.body[0].targets for n in syntax.target_names(t.target)}
        if not targets & needed:
          continue
      elif isinstance(statement, cst.If):
        body = prune(list(statement.body.body), set(needed))
        orelse = statement.orelse
        if isinstance(orelse, cst.Else):
          orelse = orelse.with_changes(body=orelse.body.with_changes(body=prune(list(orelse.body.body), set(needed))))
        statement = statement.with_changes(body=statement.body.with_changes(body=body), orelse=orelse)
      needed |= syntax.names_in(statement)
      out.append(statement)
    return out[::-1]

  return prune(statements, set())


def split_init(init: cst.FunctionDef, writer, inputs: set[str]) -> tuple[cst.FunctionDef, cst.FunctionDef | None]:
  """`(__init__ without the class's own cache variables, init_cache or None)`
  for `writer`'s class."""
  holders = cache_attributes(writer)
  own = {v.name for v in writer.own.values() if v.collection == 'cache'}
  if not holders and not own:
    return init, None
  splitter = _Splitter(writer, holders, own)
  kept, cache = splitter.split(list(init.body.body))
  candidates = set()

  def mark(block):
    for s in block:
      if isinstance(s, cst.If):
        mark(s.body.body)
        if isinstance(s.orelse, cst.Else):
          mark(s.orelse.body.body)
      elif (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Assign)
            and _assigned_attribute(s) is None):
        candidates.add(id(s))

  mark(cache)
  cache = _kept(cache, candidates)
  if all(id(s) in candidates for s in cache):
    return init, None
  # The fields the conditions and creations read, from the attributes
  # `__init__` keeps them in.
  read = set().union(*(syntax.names_in(s) for s in cache))
  bound = {n for s in cache if id(s) in candidates for t in s.body[0].targets for n in syntax.target_names(t.target)}
  fields = [f for f in writer.field_names if f in read - bound]
  missing = (read - bound) & (inputs | {'rngs'} | set(writer.mode_flags.fields))
  if missing:
    writer.fail(None, f'the decode cache is made from {sorted(missing)}, which the module does not '
                'keep; port init_cache by hand')
  # A field read once is read from its attribute; one read more often, from
  # a local (`config = self.config`), as Flax's code does.
  counts = {f: sum(1 for s in cache for _ in _names(s, f)) for f in fields}
  once = {f for f in fields if counts[f] == 1}
  cache = [s.visit(_FromAttributes(once)) for s in cache]
  prelude = [syntax.statement(f'{f} = self.{f}\n') for f in fields if f not in once]
  if not prelude and cache:  # right under the docstring: no blank line before its comments
    lines = list(cache[0].leading_lines)
    while lines and lines[0].comment is None:
      lines.pop(0)
    cache[0] = cache[0].with_changes(leading_lines=lines)
  if holders:
    doc = ('"""Makes the decode cache (again: a new sequence) for inputs `(*batch, max_length, features)`\n'
           f'{writer.file.module.default_indent * 2}(of the attention layers\' dtype unless `dtype` says)."""\n')
  else:  # its own variables only, which need neither argument
    doc = '"""Makes the decode cache (again: a new sequence); it needs neither argument."""\n'
  body = [syntax.statement(doc)] + prelude + cache
  indent = writer.file.module.default_indent
  method = syntax.statement(
      'def init_cache(self, input_shape: tuple[int, ...], dtype=None) -> None:\n  pass\n'
  ).with_changes(body=cst.IndentedBlock(body).visit(syntax.LaidOut(indent, 2 * indent)),
                 leading_lines=[cst.EmptyLine(indent=False)])
  return init.with_changes(body=init.body.with_changes(body=kept)), method


def _names(node: cst.CSTNode, name: str) -> list[cst.Name]:
  """The loads of `name` in `node` (not attributes' names, not keywords)."""
  found: list[cst.Name] = []

  class Visitor(syntax.NameLoads):
    def visit_Name(self, n):
      if n.value == name:
        found.append(n)

  node.visit(Visitor())
  return found


class _FromAttributes(cst.CSTTransformer):
  """`name` -> `self.name` for the fields in `names` (loads only)."""

  def __init__(self, names: set[str]):
    self.names = names
    self.skipped: set[int] = set()  # attributes' names, keywords

  def visit_Attribute(self, node):
    self.skipped.add(id(node.attr))

  def visit_Arg(self, node):
    if node.keyword is not None:
      self.skipped.add(id(node.keyword))

  def leave_Name(self, original, updated):
    if original.value in self.names and id(original) not in self.skipped:
      return syntax.expression(f'self.{original.value}')
    return updated
