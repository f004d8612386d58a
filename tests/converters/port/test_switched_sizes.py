"""`converters.port.switched_sizes`: the `if` on the configuration that
switches a size, and its test as `__init__` reads it."""

from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp
import libcst as cst
from flax import linen as nn

from converters.port import source, switched_sizes, syntax, tracing


class Head(nn.Module):
  width: int = 4
  classifier: str = 'token'
  extra: int | None = None

  @nn.compact
  def __call__(self, x):
    if self.classifier in ('token', 'both'):
      x = jnp.concatenate([x[:, :1], x], axis=1)
    if self.extra is not None:  # never switches the Dense below in these configurations
      x = x * self.extra
    y = nn.Dense(self.width)(x)
    if self.width > 100:  # after the creation: cannot switch its input
      y = y * 2
    return y


def _instances(*classifiers):
  file = source.file_of(Head)
  method = next(s for s in file.class_def(Head).body.body if isinstance(s, cst.FunctionDef))
  dense = next(n for n in syntax.descendants(method) if isinstance(n, cst.Call) and file.code(n.func) == 'nn.Dense')
  roots = [tracing.trace(Head(classifier=c), jax.ShapeDtypeStruct((2, 3, 5), jnp.float32))[0] for c in classifiers]
  return file, method, dense, roots


def test_the_if_whose_sides_part_the_instances_as_their_sizes_do_is_written():
  file, method, dense, (token, gap, both) = _instances('token', 'gap', 'both')
  written = switched_sizes.switched_size(file, method, dense, {'n + 1': [token, both], 'n': [gap]}, {'x'},
                                         ('width', 'classifier', 'extra'))
  assert written == "n + 1 if classifier in ('token', 'both') else n"
  # The sizes the other way round: the same test, the sides swapped.
  written = switched_sizes.switched_size(file, method, dense, {'n': [gap], 'n + 1': [token, both]}, {'x'},
                                         ('width', 'classifier', 'extra'))
  assert written == "n + 1 if classifier in ('token', 'both') else n"


def test_no_if_parts_instances_of_one_configuration_or_three_sizes():
  file, method, dense, (token, other_token, gap) = _instances('token', 'token', 'gap')
  fields = ('width', 'classifier', 'extra')
  assert switched_sizes.switched_size(file, method, dense, {'a': [token], 'b': [other_token, gap]}, {'x'}, fields) is None
  assert switched_sizes.switched_size(file, method, dense, {'a': [token], 'b': [gap], 'c': [other_token]},
                                      {'x'}, fields) is None


def test_a_test_reads_the_fields_as_init_arguments_or_is_not_written():
  file = source.file_of(Head)
  fields = ('classifier', 'config')
  assert switched_sizes.init_test(syntax.expression("self.classifier == 'gap'"), file, fields) == "classifier == 'gap'"
  assert switched_sizes.init_test(syntax.expression('self.config.pool and not self.classifier'), file,
                                  fields) == 'config.pool and not classifier'
  assert switched_sizes.init_test(syntax.expression('self.is_initializing()'), file, fields) is None


def test_a_field_the_test_does_not_read_that_parts_the_instances_alike_makes_it_a_guess():
  file = source.file_of(Head)
  method = next(s for s in file.class_def(Head).body.body if isinstance(s, cst.FunctionDef))
  dense = next(n for n in syntax.descendants(method) if isinstance(n, cst.Call) and file.code(n.func) == 'nn.Dense')
  x = jax.ShapeDtypeStruct((2, 3, 5), jnp.float32)
  fields = ('width', 'classifier', 'extra')

  def traced(**config):
    return tracing.trace(Head(**config), x)[0]

  # `extra` given exactly where the classifier adds a token: either may be what switches the size.
  token, gap = traced(classifier='token', extra=2), traced(classifier='gap')
  assert switched_sizes.switched_size(file, method, dense, {'n + 1': [token], 'n': [gap]}, {'x'}, fields) is None
  # Given on both sides of the classifier's split: not what switches it.
  other = traced(classifier='gap', extra=3)
  written = switched_sizes.switched_size(file, method, dense, {'n + 1': [token], 'n': [gap, other]}, {'x'}, fields)
  assert written == "n + 1 if classifier in ('token', 'both') else n"


class Projected(nn.Module):
  """`if`s before the sized layers where, for some instances, none is the
  only one that parts them: which one switches the size, the trace cannot
  tell."""

  out_dim: int | None = None
  depth: int = 2
  use: bool = True
  double: bool = False
  norm: bool = False

  @nn.compact
  def __call__(self, x):
    if self.use:
      if self.out_dim is not None:
        x = nn.Dense(self.out_dim)(x)
      y = nn.Dense(x.shape[-1], name='inside')(x)  # under the `if self.use` it shares
    if self.out_dim is not None and self.depth > 1:  # where `out_dim` is given, alike
      x = nn.LayerNorm()(x)
    if self.double:
      x = jnp.concatenate([x, x], -1)
    if self.norm:
      x = nn.LayerNorm()(x)
    return nn.Dense(x.shape[-1], name='outside')(x) + y.sum()


def _projected(*configurations):
  file = source.file_of(Projected)
  method = next(s for s in file.class_def(Projected).body.body if isinstance(s, cst.FunctionDef))
  dense = {n.args[1].value.evaluated_value: n for n in syntax.descendants(method)
           if isinstance(n, cst.Call) and file.code(n.func) == 'nn.Dense' and len(n.args) == 2}
  x = jax.ShapeDtypeStruct((2, 5), jnp.float32)
  roots = [tracing.trace(Projected(**c), x)[0] for c in configurations]
  fields = ('out_dim', 'depth', 'use', 'double', 'norm')
  return file, method, dense, roots, fields


def test_two_ifs_that_part_the_instances_alike_make_the_test_a_guess():
  file, method, dense, (none, given), fields = _projected({}, {'out_dim': 4})
  sizes = {'out_dim': [given], 'in_features': [none]}
  assert switched_sizes.switched_size(file, method, dense['outside'], sizes, {'x'}, fields) is None
  # With the depth at 1, only the first parts them; but it is nested in
  # an `if` the creation is not in, so its test alone is not what decides.
  _, _, _, (none, given), _ = _projected({'depth': 1}, {'out_dim': 4, 'depth': 1})
  sizes = {'out_dim': [given], 'in_features': [none]}
  assert switched_sizes.switched_size(file, method, dense['outside'], sizes, {'x'}, fields) is None
  # Under the `if` both are in, it is written.
  assert switched_sizes.switched_size(file, method, dense['inside'], sizes, {'x'}, fields) == (
      'out_dim if out_dim is not None else in_features')


def test_two_flags_that_part_the_instances_alike_make_the_test_a_guess():
  file, method, dense, (plain, doubled, doubled_normed), fields = _projected(
      {}, {'double': True}, {'double': True, 'norm': True})
  assert switched_sizes.switched_size(file, method, dense['outside'], {'n * 2': [doubled], 'n': [plain]},
                                      {'x'}, fields) == 'n * 2 if double else n'
  assert switched_sizes.switched_size(file, method, dense['outside'], {'n * 2': [doubled_normed], 'n': [plain]},
                                      {'x'}, fields) is None


class Decoyed(nn.Module):
  """An `if` whose test parts the instances as the size does but which
  changes nothing the size is read from, and the `if` expression that
  switches it."""

  out_dim: int | None = None
  depth: int = 2

  @nn.compact
  def __call__(self, x):
    h = x
    if self.out_dim is not None and self.depth > 1:
      h = nn.LayerNorm()(h)
    y = x if self.out_dim is None else nn.Dense(self.out_dim)(x)
    return nn.Dense(y.shape[-1], name='sized')(h)


class Appended(nn.Module):
  """One `if` switching a size by changing a list in place."""

  pool: str = 'none'

  @nn.compact
  def __call__(self, x):
    parts = [x]
    if self.pool == 'cat':
      parts.append(x * 2)
    h = jnp.concatenate(parts, -1)
    return nn.Dense(3, name='sized')(h)


def _sized(cls, configurations, sizes):
  file = source.file_of(cls)
  method = next(s for s in file.class_def(cls).body.body if isinstance(s, cst.FunctionDef))
  sized = next(n for n in syntax.descendants(method)
               if isinstance(n, cst.Call) and file.code(n.func) == 'nn.Dense' and 'sized' in file.code(n))
  x = jax.ShapeDtypeStruct((2, 5), jnp.float32)
  traced = [tracing.trace(cls(**c), x)[0] for c in configurations]
  fields = tuple(f.name for f in dataclasses.fields(cls) if f.name not in ('parent', 'name'))
  by_size = {size: [traced[i]] for i, size in enumerate(sizes)}
  return lambda read: switched_sizes.switched_size(file, method, sized, by_size, {'x'}, fields, read=read)


def test_the_if_written_changes_what_the_size_is_read_from():
  written = _sized(Appended, ({'pool': 'cat'}, {}), ('in_features * 2', 'in_features'))
  # Read from `h`, computed from the list the `if` appends to.
  assert written({'h'}) == "in_features * 2 if pool == 'cat' else in_features"
  assert written(None) == "in_features * 2 if pool == 'cat' else in_features"
  # Read from `x` alone, which the `if` does not change: it cannot switch the size.
  assert written({'x'}) is None


def test_two_ifs_part_the_instances_alike_whichever_changes_what_the_size_is_read_from():
  # Read from `y`, which only the `if` expression assigns; from `h`, which
  # only the `if` binds: still two tests the trace cannot tell apart.
  written = _sized(Decoyed, ({'out_dim': 4}, {}), ('out_dim', 'in_features'))
  for read in ({'y'}, {'h'}, None):
    assert written(read) is None


class Nested(nn.Module):
  heads: int | None = None

  @nn.compact
  def __call__(self, x):
    x = x if self.heads is None else (jnp.concatenate([x, x], -1) if self.heads > 1 else x)
    return nn.Dense(3, name='sized')(x)


def test_an_if_expression_holding_another_is_not_all_that_decides():
  written = _sized(Nested, ({'heads': 2}, {}), ('in_features * 2', 'in_features'))
  assert written({'x'}) is None
