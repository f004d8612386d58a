"""A Linen module's own variables and sown values, written the NNX way.

- `self.param('w', init, shape)` -> `self.w = nnx.Param(init(rngs.params(),
  shape))` where the module is built, and `self.w[...]` where Linen read it;
- `self.variable('batch_stats', 'mean', init, *args)` -> `self.mean =
  nnx.BatchStat(init(*args))` (`nnx.Cache` for `cache`), and `self.mean`
  where Linen held the variable, its `.value` read as `[...]`;
- `self.sow('intermediates', 'h', x)` -> `self.sow(nnx.Intermediate, 'h', x)`;
- `self.has_variable('cache', 'i')` -> `True`: Linen's `init` makes a decode
  cache on the first call, NNX where it builds the module (under the same
  conditions, `if decode:`), so in a call the cache is there.

A size computed from the call's inputs (`(x.shape[-1],)`) is written as the
variable's shape from the symbolic trace, which is what NNX knows when it
builds; an initializer or argument that depends on the call otherwise is
refused.
"""

from __future__ import annotations

import dataclasses

import jax
import libcst as cst
from flax.core import meta

from converters.port import input_reads, syntax

#: Linen collections a `self.variable` may name, and their NNX type.
VARIABLE_TYPES = {'params': 'nnx.Param', 'batch_stats': 'nnx.BatchStat', 'cache': 'nnx.Cache'}
SOWN_TYPES = {'intermediates': 'nnx.Intermediate'}


@dataclasses.dataclass
class OwnVariable:
  """A variable the module makes itself: its Linen name and collection, the
  NNX expression making it, and what reads it in the methods."""

  name: str
  collection: str
  creation: cst.BaseExpression
  read: cst.BaseExpression
  #: The field holding its name, where the module names it by one
  #: (`self.param(self.weight_name, ...)`, a Gemma `Einsum`): NNX sets and
  #: gets the attribute of that name (`setattr(self, weight_name, ...)`).
  named_by: str | None = None

  def assignment(self) -> cst.BaseSmallStatement:
    """The statement of `__init__` that makes it."""
    if self.named_by is None:
      return cst.Assign([cst.AssignTarget(syntax.expression(f'self.{self.name}'))], self.creation)
    call = syntax.expression(f'setattr(self, {self.named_by}, __value__)')
    return cst.Expr(call.with_changes(args=[*call.args[:2], cst.Arg(self.creation)]))


def is_own_variable_call(node: cst.CSTNode) -> bool:
  return (
      isinstance(node, cst.Call) and syntax.self_attribute(node.func) in ('param', 'variable')
  )


def is_has_cache_variable(node: cst.CSTNode) -> bool:
  """`self.has_variable('cache', 'name')`: Linen's decode idiom, where the
  first call (`init`) makes the cache and later ones use it."""
  return (
      isinstance(node, cst.Call) and syntax.self_attribute(node.func) == 'has_variable' and len(node.args) == 2
      and all(a.keyword is None and isinstance(a.value, cst.SimpleString) for a in node.args)
      and node.args[0].value.evaluated_value == 'cache'
  )


def is_sow_call(node: cst.CSTNode) -> bool:
  return (
      isinstance(node, cst.Call) and syntax.self_attribute(node.func) == 'sow'
  )


def _literal(arg: cst.Arg | None) -> str | None:
  if arg is not None and isinstance(arg.value, cst.SimpleString):
    return arg.value.evaluated_value
  return None


def _one_line(arg: cst.Arg, value: cst.BaseExpression) -> cst.Arg:
  """`arg` with `value`, on one line, as NNX's call lays it out (the Linen
  call's commas and line breaks were around other arguments)."""
  return arg.with_changes(value=value, comma=cst.MaybeSentinel.DEFAULT,
                          whitespace_after_arg=cst.SimpleWhitespace(''))


def own_variable(call: cst.Call, writer, where: cst.CSTNode | None = None) -> OwnVariable:
  """The NNX form of a `self.param(...)` or `self.variable(...)` call of
  `writer`'s class (`writer.fail` refuses, at `where` if the call is not the
  source's own; `writer.symbolic` has the variable's symbolic shape)."""
  where = call if where is None else where
  kind = call.func.attr.value
  collection, name, named_by, rest = _named(call, writer, where)
  if len(rest) < 2:
    writer.fail(where, f'self.{kind}({name!r}) without an initializer; port it by hand')
  init, init_args = rest[1], rest[2:]
  function = init.value
  if syntax.names_in(function) & writer.call_time:
    function = _with_shape_sizes(function, init_args[0].value if init_args else None, collection, name, writer)
    if function is None:
      writer.fail(where, f'the initializer of {name!r} depends on the call; port it by hand')
  written = [_written_argument(i, arg, collection, name, writer, where) for i, arg in enumerate(init_args)]
  key = [cst.Arg(syntax.expression('rngs.params()'))] if kind == 'param' else []
  arguments = syntax.normalised(key + written)
  value = cst.Call(function, arguments)
  if isinstance(function, cst.Lambda):
    # Its body with the arguments in place (ruff's PLC3002 refuses a lambda
    # called where it is written), or, where that would draw a key twice,
    # the lambda called.
    value = _applied(function, [a.value for a in arguments]) or cst.Call(
        function.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]), arguments)
  creation = syntax.expression(f'{VARIABLE_TYPES[collection]}(__init__())').with_changes(args=[cst.Arg(value)])
  attribute = f'getattr(self, self.{named_by})' if named_by else f'self.{name}'
  read = syntax.expression(f'{attribute}[...]' if kind == 'param' else attribute)
  return OwnVariable(name, collection, creation, read, named_by)


def _named(call: cst.Call, writer, where: cst.CSTNode) -> tuple[str, str, str | None, list[cst.Arg]]:
  """`(collection, name, field naming it or None, the arguments from the
  name on)` of a `self.param(...)` or `self.variable(...)` call; refused
  (`writer.fail`, at `where`) where it has keyword or starred arguments,
  makes a collection with no NNX Variable type or is named by an
  expression other than a literal or a field."""
  kind = call.func.attr.value
  args = list(call.args)
  if any(a.star or a.keyword is not None for a in args):
    writer.fail(where, f'self.{kind}(...) with keyword or starred arguments; port it by hand')
  if kind == 'param':
    collection, rest = 'params', args
  else:
    collection, rest = _literal(args[0] if args else None), args[1:]
    if collection not in VARIABLE_TYPES:
      writer.fail(where, f'self.variable({writer.file.code(args[0].value) if args else ""}, ...): '
                  'a collection the port has no NNX Variable type for; port it by hand')
  name = _literal(rest[0] if rest else None)
  named_by = _naming_field(rest[0].value, writer) if rest and name is None else None
  if named_by is not None:
    name = getattr(writer.instances[0].module, named_by)  # the traced one's, for its shape
  elif name is None or not name.isidentifier():
    writer.fail(where, f'self.{kind}(...) named by an expression other than a field; port it by hand')
  return collection, name, named_by, rest


def _written_argument(index: int, arg: cst.Arg, collection: str, name: str, writer, where: cst.CSTNode
                      ) -> cst.Arg:
  """Argument `index` of the initializer of the variable `name`, as
  `__init__` gives it: the sizes of the inputs it reads written as sizes,
  the shape (the first) from the symbolic trace where it reads the call;
  refused (`writer.fail`, at `where`) where it reads the call otherwise."""
  value = arg.value
  if not syntax.names_in(value) & writer.call_time:
    return _one_line(arg, value)
  if index != 0:
    # Not the shape (`get_2d_sincos_pos_embed(key, width, num_patches)`):
    # its sizes of the inputs written as sizes, as `__init__` knows them.
    value = input_reads.without_input_reads(writer, value) or _dtype_parameter(arg.value, collection, name, writer)
    if value is None:
      writer.fail(where, f'argument {index + 2} of {name!r} depends on the call otherwise than through '
                  'its inputs\' sizes; port it by hand')
    return _one_line(arg, value)
  # The shape, from the inputs' sizes: the variable's own shape, in the
  # symbolic trace of an instance that made it (a class token only the
  # configuration `pool_type='tok'` makes).
  shape, table = _traced(collection, name, writer)
  if shape is None and (rewritten := input_reads.without_input_reads(writer, value)) is not None:
    # Not made in the trace (a branch the configuration skips): the
    # shape's source, with the inputs' sizes it reads written as sizes.
    return _one_line(arg, rewritten)
  if shape is None:  # nor so: the trace of an instance that makes it (a flag's position table)
    shape, table = _traced(collection, name, writer, own_variables=True)
  if shape is None:
    writer.fail(where, f'the shape of {name!r} is not known from the trace (not made at this '
                'configuration) and reads the call; port it by hand')
  if not hasattr(shape, 'shape'):
    writer.fail(where, f'the shape of {name!r} is not known from the trace; port it by hand')
  sizes = [writer.sizes.size_source(d, table) for d in shape.shape]
  return _one_line(arg, syntax.expression(syntax.tuple_source(sizes)))


def _with_shape_sizes(init: cst.BaseExpression, shape: cst.BaseExpression | None, collection: str, name: str,
                      writer) -> cst.BaseExpression | None:
  """`init` with each local of the call it reads that is also an item of
  the variable's shape (`normal(stddev=1/np.sqrt(c))` of a shape `(1, l, c)`)
  written as that size of the traced variable; None if it reads the call
  otherwise."""
  made, table = _traced(collection, name, writer)
  if not isinstance(shape, (cst.Tuple, cst.List)) or made is None or not hasattr(made, 'shape') \
     or len(made.shape) != len(shape.elements):
    return None
  sizes = {}
  for element, size in zip(shape.elements, made.shape):
    if isinstance(element.value, cst.Name) and element.value.value in writer.call_time:
      sizes.setdefault(element.value.value, syntax.expression(writer.sizes.size_source(size, table)))
  written = init.visit(syntax.ReadAs(sizes))
  return None if syntax.names_in(written) & writer.call_time else written


def _dtype_parameter(value: cst.BaseExpression, collection: str, name: str, writer) -> cst.Name | None:
  """For a variable made in the dtype of a value of the call (`self.param(
  'pos_embedding', init, shape, inputs.dtype)`), the constructor's keyword
  `inputs_dtype`, its default the dtype the trace made the variable in (NNX
  builds before any input is seen, as Flax's layers take `param_dtype`);
  None for any other value."""
  if not (isinstance(value, cst.Attribute) and value.attr.value == 'dtype' and isinstance(value.value, cst.Name)
          and value.value.value in writer.call_time):
    return None
  made, _ = _traced(collection, name, writer)
  if made is None or not hasattr(made, 'dtype'):
    return None
  return cst.Name(writer.dtype_parameter(value.value.value, jax.numpy.dtype(made.dtype).name))


def _traced(collection: str, name: str, writer, own_variables: bool = False):
  """`(abstract array, symbol table)` of the variable in the symbolic trace
  of the first instance that made it (a class token only `pool_type='tok'`
  makes), an annotated one's array (the box's pytree child; `unbox` would
  constrain it to the mesh in context); `(None, None)` where none did. With
  `own_variables`, in a trace of its own for an instance that made it (one
  shared with instances that do not lacks it: a flag's position table)."""
  for instance in writer.instances:
    if own_variables and name not in instance.reserved:
      continue
    symbolic = writer.symbolic_of(instance, own_variables)
    made = symbolic.variables.get(collection, {}).get(name)
    if made is not None:
      if isinstance(made, meta.AxisMetadata):
        (made,) = jax.tree.leaves(made)
      return made, symbolic.table
  return None, None


def _naming_field(value: cst.BaseExpression, writer) -> str | None:
  """The field `value` reads (`self.weight_name`) where every instance holds
  a Python name there; else None."""
  path = writer.field_path(value)
  if path is None or '.' in path:
    return None
  names = [getattr(i.module, path) for i in writer.instances]
  return path if all(isinstance(n, str) and n.isidentifier() for n in names) else None


def _applied(function: cst.Lambda, values: list[cst.BaseExpression]) -> cst.BaseExpression | None:
  """`function`'s body with each parameter replaced by its value; None
  where its parameters are not plain (defaults, `*args`), its body holds a
  lambda, or a value that calls something (a key drawn) would be read more
  than once."""
  params = function.params
  if (params.star_arg is not cst.MaybeSentinel.DEFAULT or params.kwonly_params or params.star_kwarg
      or params.posonly_params or any(p.default is not None for p in params.params)
      or len(params.params) != len(values)):
    return None
  names = {p.name.value: v for p, v in zip(params.params, values)}
  counts = dict.fromkeys(names, 0)
  nested = []

  class Count(syntax.NameLoads):
    def visit_Lambda(self, node):
      nested.append(node)

    def visit_Name(self, node):
      if node.value in counts:
        counts[node.value] += 1

  function.body.visit(Count())
  if nested or any(counts[n] > 1 and syntax.calls_in(v) for n, v in names.items()):
    return None

  class Substitute(cst.CSTTransformer):
    def leave_Attribute(self, original, updated):
      return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):
      return updated.with_changes(keyword=original.keyword)

    def leave_Name(self, original, updated):
      value = names.get(original.value)
      if value is None:
        return updated
      # In brackets unless it binds tighter than any operator (`v * s` with
      # `v = a + 0.5` is `(a + 0.5) * s`).
      return value if isinstance(value, _ATOMS) or value.lpar else value.with_changes(
          lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

  return function.body.visit(Substitute())


#: Expressions that need no brackets wherever they are put.
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.SimpleString,
          cst.Tuple, cst.List, cst.Dict)


def sow(original: cst.Call, updated: cst.Call, writer) -> cst.Call:
  """`self.sow(nnx.Intermediate, ...)` for Linen's `self.sow('intermediates',
  ...)`; into another collection (`'losses'`, an auxiliary loss), a subclass
  of `nnx.Intermediate` the file defines for it (`writer.sown`): what is sown
  is an output of the call, kept only where asked (`nnx.capture(model,
  Losses)`), as Linen keeps it only in a mutable collection."""
  collection = _literal(original.args[0] if original.args else None)
  if collection is None:
    writer.fail(original, 'self.sow into a collection named by an expression; port it by hand')
  if collection in SOWN_TYPES:
    kind = SOWN_TYPES[collection]
  else:
    defined = {n for statement in writer.file.module.body for n in syntax.bound_names(statement)}
    kind = writer.sown.setdefault(collection, sown_type_name(collection, defined))
  first = updated.args[0].with_changes(value=syntax.expression(kind))
  return updated.with_changes(args=[first, *updated.args[1:]])


def sown_type_name(collection: str, taken: set[str] = frozenset()) -> str:
  """The NNX type of a Linen collection sown into: `'losses'` -> `Losses`;
  `SownInto_<collection>` where that is no identifier, is not the
  collection's alone (`'my-stats'` beside `'my_stats'`) or names something
  of the model's file (`'aux'` beside a class `Aux`)."""
  name = ''.join(part[:1].upper() + part[1:] for part in collection.split('_'))
  if name.isidentifier() and name[:1].isupper() and collection.islower() and name not in taken:
    return name
  return 'SownInto_' + ''.join(c if c.isalnum() else '_' for c in collection)


def sown_type(collection: str, name: str, indent: str = '    ') -> str:
  """The class statement of `sown_type_name(collection)`."""
  return (f'class {name}(nnx.Intermediate):\n'
          f'{indent}"""What the model sows into Linen\'s {collection!r} collection (read it with\n'
          f'{indent}`nnx.capture(model, {name})`, as Linen with `mutable=[{collection!r}]`)."""\n')


class ValueReads(cst.CSTTransformer):
  """`v.value` -> `v[...]` for the names holding NNX Variables (reads and
  assignments alike: `v.value = x` becomes `v[...] = x`)."""

  def __init__(self, names: set[str]):
    self.names = names

  def leave_Attribute(self, original, updated):
    if (isinstance(updated.value, cst.Name) and updated.value.value in self.names
        and updated.attr.value == 'value'):
      return cst.Subscript(updated.value, [cst.SubscriptElement(cst.Index(cst.Ellipsis()))])
    return updated
