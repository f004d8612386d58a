"""`converters.transforms.Rearrange`: patterns, values both ways, and where names go.

Values are checked against index formulas written out element by element
(not against another reshape), and every pattern is checked to read back.
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from converters.errors import AnnotationError, PathMappingError, ShapeError
from converters.transforms import Rearrange, Step
from tests.helpers import mesh


@pytest.mark.parametrize(
    'pattern, sizes, message',
    [
        ('e h d', {}, 'one arrow'),
        ('e h d -> e (h d) -> x', {}, 'one arrow'),
        ('e h d -> e (h d)', {}, 'sizes of all but one'),
        ('a b c -> (a b) d', {'a': 2}, 'every axis must be on both sides'),
        ('a -> b', {}, 'every axis must be on both sides'),
        ('a a -> a', {}, 'appear twice'),
        ('a (b -> a b', {}, 'not closed'),
        ('a ((b c)) -> a b c', {}, 'do not nest'),
        ('a () -> a', {}, 'empty'),
        ('a b) -> a b', {}, 'empty or unopened'),
        ('a 2 -> a', {}, 'cannot read'),
        ('e h d -> e (h d)', {'x': 2}, 'name no axis'),
        ('e h -> e (qkv h)', {'qkv': 3}, 'name no axis'),
        ('e h d -> e (h d)', {'h': 0}, 'positive ints'),
        ('e h d -> e (h d)', {'h': True}, 'positive ints'),
    ],
)
def test_malformed_patterns_are_refused_with_what_to_write(pattern, sizes, message):
  with pytest.raises(PathMappingError, match=message.replace('(', r'\(').replace('[', r'\[')):
    Rearrange(pattern, **sizes)


def test_patterns_compare_by_their_text_and_sizes():
  assert Rearrange('e h d -> e (h d)', h=2) == Rearrange('e  h d->e (h d)', h=2)
  assert Rearrange('e h d -> e (h d)', h=2) != Rearrange('e h d -> e (h d)', h=4)
  assert hash(Rearrange('i o -> o i')) == hash(Rearrange('i o -> o i'))
  assert repr(Rearrange('e h d -> e (h d)', h=2)) == "Rearrange('e h d -> e (h d)', h=2)"


def test_the_part_axis_is_the_axis_only_the_fused_side_has():
  fuse = Rearrange('e h d -> e (h qkv d)', h=2)
  assert (fuse.part_axis, fuse.fused_side) == ('qkv', 'nnx')
  assert fuse.is_parted('linen') and not fuse.is_parted('nnx')
  split = Rearrange('qkv e h d -> e h d')
  assert (split.part_axis, split.fused_side) == ('qkv', 'linen')
  assert Rearrange('i o -> o i').part_axis is None


def _array(shape, offset=0):
  return jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape) + offset


dims = st.integers(1, 4)


@given(e=dims, h=dims, d=dims, lead=st.sampled_from([(), (3,)]))
def test_merge_and_split_follow_row_major_order(e, h, d, lead):
  rearrange = Rearrange('e h d -> e (h d)', h=h)
  x = _array(lead + (e, h, d))
  (y,) = rearrange.apply([x], 'linen', len(lead))
  assert y.shape == lead + (e, h * d)
  x_np, y_np = np.asarray(x), np.asarray(y)
  for index in itertools.product(*map(range, lead + (e, h, d))):
    *l, i, j, k = index
    assert y_np[(*l, i, j * d + k)] == x_np[index]
  (back,) = rearrange.apply([y], 'nnx', len(lead))
  np.testing.assert_array_equal(back, x)


@given(i=dims, o=dims)
def test_transpose(i, o):
  rearrange = Rearrange('i o -> o i')
  x = _array((i, o))
  (y,) = rearrange.apply([x], 'linen', 0)
  np.testing.assert_array_equal(y, np.asarray(x).T)
  np.testing.assert_array_equal(rearrange.apply([y], 'nnx', 0)[0], x)


@given(e=dims, h=dims, d=dims, heads_major=st.booleans(), lead=st.sampled_from([(), (2,)]))
def test_fuse_and_split_of_query_key_value(e, h, d, heads_major, lead):
  pattern = 'e h d -> e (h qkv d)' if heads_major else 'e h d -> e (qkv h d)'
  rearrange = Rearrange(pattern, h=h)
  parts = [_array(lead + (e, h, d), offset=1000 * p) for p in range(3)]
  (fused,) = rearrange.apply(parts, 'linen', len(lead), 3)
  assert fused.shape == lead + (e, 3 * h * d)
  fused_np = np.asarray(fused)
  for p, part in enumerate(parts):
    for index in itertools.product(*map(range, lead + (e, h, d))):
      *l, i, j, k = index
      column = (j * 3 + p) * d + k if heads_major else (p * h + j) * d + k
      assert fused_np[(*l, i, column)] == np.asarray(part)[index]
  for p, part in enumerate(rearrange.apply([fused], 'nnx', len(lead), 3)):
    np.testing.assert_array_equal(part, parts[p])
  assert Step(rearrange, 'nnx', len(lead), 1, 3)([fused]).shape == parts[1].shape


@st.composite
def patterns(draw):
  """A random pattern over up to four axes (each side a grouping of its own
  permutation), their sizes, and whether one axis is a part axis."""
  count = draw(st.integers(1, 4))
  axes = list('abcd'[:count])
  sizes = {a: draw(st.integers(1, 3)) for a in axes}

  def side(order):
    groups, rest = [], list(order)
    while rest:
      take = draw(st.integers(1, len(rest)))
      groups.append(tuple(rest[:take]))
      rest = rest[take:]
    return groups

  linen = side(draw(st.permutations(axes)))
  nnx_side = side(draw(st.permutations(axes)))
  part = draw(st.sampled_from([None] + axes)) if count > 1 else None
  return linen, nnx_side, sizes, part


def _text(groups, drop=None):
  parts = [[a for a in g if a != drop] for g in groups]
  return ' '.join(g[0] if len(g) == 1 else '(' + ' '.join(g) + ')' for g in parts if g)


def _flat_index(groups, index, sizes, drop=None):
  """Row-major position of the elementary `index` in each group."""
  out = []
  for group in groups:
    kept = [a for a in group if a != drop]
    if not kept:
      continue
    position = 0
    for a in kept:
      position = position * sizes[a] + index[a]
    out.append(position)
  return tuple(out)


@given(patterns())
def test_random_patterns_move_every_element_where_its_axes_say(drawn):
  linen, nnx_side, sizes, part = drawn
  if part is not None and any(g == (part,) for g in linen):
    linen = [g for g in linen if g != (part,)]  # the part axis only on the fused (NNX) side
  elif part is not None:
    part = None
  pattern = f'{_text(linen, part)} -> {_text(nnx_side)}'
  rearrange = Rearrange(pattern, **{a: n for a, n in sizes.items() if a != part})
  parts = sizes[part] if part else 1
  linen_shape = tuple(math.prod(sizes[a] for a in g if a != part) for g in linen)
  sources = [_array(linen_shape, offset=1000 * p) for p in range(parts)]
  (fused,) = rearrange.apply(sources, 'linen', 0, parts)
  fused_np = np.asarray(fused)
  for values in itertools.product(*(range(sizes[a]) for a in sorted(sizes))):
    index = dict(zip(sorted(sizes), values))
    source = np.asarray(sources[index[part] if part else 0])
    assert fused_np[_flat_index(nnx_side, index, sizes)] == source[_flat_index(linen, index, sizes, part)]
  back = rearrange.apply([fused], 'nnx', 0, parts)
  for got, want in zip(back, sources, strict=True):
    np.testing.assert_array_equal(got, want)


def test_shapes_the_pattern_does_not_describe_are_refused():
  rearrange = Rearrange('e h d -> e (h d)', h=3)
  with pytest.raises(ShapeError, match='w: shape .* has 2 dimensions'):
    rearrange.axis_sizes('linen', [(4, 6)], 0, 1, 'w')
  with pytest.raises(ShapeError, match=r'w: a dimension of size 4 cannot be \(h d\)'):
    rearrange.axis_sizes('nnx', [(2, 4)], 0, 1, 'w')
  with pytest.raises(ShapeError, match=r'w: a dimension of size 2 cannot be \(h\)'):
    rearrange.axis_sizes('linen', [(5, 2, 7)], 0, 1, 'w')
  with pytest.raises(ShapeError, match='parts of a fused parameter differ in shape'):
    Rearrange('e h -> e (qkv h)').axis_sizes('linen', [(2, 3), (2, 4)], 0, 2, 'w')


def _sharded(*names):
  return lambda name: name in names


def test_names_travel_with_their_axes():
  assert Rearrange('i o -> o i').target_names('linen', ('in', 'out'), _sharded(), 'w') == ('out', 'in')
  merge = Rearrange('e h d -> e (h d)', h=2)
  # Flax names a DenseGeneral kernel's flat form: fewer names than dimensions.
  assert merge.target_names('linen', ('embed', 'heads'), _sharded('heads'), 'w') == ('embed', 'heads')
  assert merge.target_names('nnx', ('embed', 'heads'), _sharded('heads'), 'w') == ('embed', 'heads')
  # A name that shards nothing is merged away; trailing Nones are left out.
  assert merge.target_names('linen', ('embed', 'heads', 'kv'), _sharded('heads'), 'w') == ('embed', 'heads')
  assert merge.target_names('linen', (None, None, None), _sharded(), 'w') == ()
  assert merge.target_names('linen', None, _sharded(), 'w') is None
  heads_major = Rearrange('e h d -> e (h qkv d)', h=2)
  assert heads_major.target_names('linen', (None, 'model'), _sharded('model'), 'w') == (None, 'model')
  assert heads_major.target_names('nnx', (None, 'model'), _sharded('model'), 'w') == (None, 'model')


@pytest.mark.parametrize(
    'pattern, source, names, axis',
    [
        ('e h d -> e (h d)', 'linen', ('embed', None, 'model'), 'd'),
        ('e h d -> e (qkv h d)', 'linen', ('embed', 'model'), 'h'),
        ('e h d -> e (qkv h d)', 'nnx', ('embed', 'model'), 'qkv'),
        ('qkv e h -> e h', 'linen', ('model',), 'qkv'),
    ],
)
def test_a_sharding_that_cannot_follow_is_refused_naming_the_axis(pattern, source, names, axis):
  rearrange = Rearrange(pattern, h=2)
  with pytest.raises(AnnotationError, match=f'w: .* cannot carry the sharding of axis {axis} '):
    rearrange.target_names(source, names, _sharded('model'), 'w')


def test_more_names_than_axes_are_refused():
  with pytest.raises(AnnotationError, match='3 sharding names'):
    Rearrange('i o -> o i').target_names('linen', ('a', 'b', 'c'), _sharded(), 'w')


# -- in conversions: a Flax attention ported to fused and flat kernels ---------------


import jax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from converters import PathMapping, PathRule, linen_to_nnx, nnx_to_linen, relayout  # noqa: E402
from converters.errors import LayoutError, StructureError  # noqa: E402

E, H, D, LAYERS = 8, 4, 2, 3
RULES = (('embed', None), ('heads', 'model'), ('layers', None))
QKV = ('query', 'key', 'value')


class Attention(nn.Module):
  """Query, key, value and out projections as Flax's attention makes them."""

  @nn.compact
  def __call__(self, x):
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'heads'))
    q, k, v = (nn.DenseGeneral((H, D), kernel_init=init, name=n)(x) for n in QKV)
    out_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('heads', 'embed'))
    return nn.DenseGeneral(E, axis=(-2, -1), kernel_init=out_init, name='out')(q * k + v)


class Stack(nn.Module):
  @nn.compact
  def __call__(self, x):
    scanned = nn.scan(
        lambda module, carry, _: (module(carry), None),
        variable_axes={'params': 0}, split_rngs={'params': True}, length=LAYERS,
        metadata_params={nn.PARTITION_NAME: 'layers'},
    )
    return scanned(Attention(name='attention'), x, None)[0]


def _unique_values(variables):
  """Every element of every parameter distinct, each placed where it was."""
  counter = iter(range(1, 1000))

  def refill(box):
    value = nn.unbox(box)
    fresh = np.arange(value.size, dtype=np.float32).reshape(value.shape) + 10_000 * next(counter)
    placed = jax.device_put(fresh, value.sharding)
    return box.replace_boxed(placed) if isinstance(box, nn.meta.AxisMetadata) else placed

  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  return jax.tree.map(refill, variables, is_leaf=is_box)


def linen_variables(module, rules=RULES):
  x = jnp.ones((2, E))
  with jax.set_mesh(mesh()), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(module.init, jax.random.key(0), x)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh(), rules)
    return _unique_values(jax.jit(module.init, out_shardings=shardings)(jax.random.key(0), x))


def fused_rules(prefix='', nnx_prefix='', pattern='e h d -> e (h qkv d)', **layers):
  """Query, key, value fused (heads-major), the out projection flattened."""
  def rule(linen, nnx_path, transform):
    stacked = {}
    if layers:
      stacked = dict(
          linen_stacked=tuple(l.replace(prefix, layers['linen']) for l in linen) if isinstance(linen, tuple) else linen.replace(prefix, layers['linen']),
          nnx_stacked=nnx_path.replace(nnx_prefix, layers['nnx']),
      )
    return PathRule(linen, nnx_path, transform=transform, **stacked)

  return PathMapping([
      rule(tuple(f'{prefix}{n}/kernel' for n in QKV), f'{nnx_prefix}qkv/kernel',
           Rearrange(pattern, h=H)),
      rule(tuple(f'{prefix}{n}/bias' for n in QKV), f'{nnx_prefix}qkv/bias',
           Rearrange(pattern.replace('e ', ''), h=H)),
      rule(f'{prefix}out/kernel', f'{nnx_prefix}out/kernel', Rearrange('h d e -> (h d) e', h=H)),
      rule(f'{prefix}out/bias', f'{nnx_prefix}out/bias', None),
  ])


def _shard_values(array) -> dict:
  return {
      shard.device.id: set(np.asarray(shard.data).ravel().tolist())
      for shard in array.addressable_shards
  }


def test_fused_and_flattened_kernels_carry_values_and_sharding():
  variables = linen_variables(Attention())
  params = nn.unbox(variables)['params']
  with nn.logical_axis_rules(RULES):
    state = linen_to_nnx(variables, paths=fused_rules())
  qkv = state['qkv']['kernel']
  assert qkv.shape == (E, 3 * H * D) and qkv.get_metadata()['out_sharding'] == ('embed', 'heads')
  fused = np.asarray(qkv[...])
  for p, name in enumerate(QKV):
    part = np.asarray(params[name]['kernel'])
    for i, j, k in itertools.product(range(E), range(H), range(D)):
      assert fused[i, (j * 3 + p) * D + k] == part[i, j, k]
  out = state['out']['kernel']
  np.testing.assert_array_equal(out[...], np.asarray(params['out']['kernel']).reshape(H * D, E))
  # The sharding follows: each device holds the same values as before, rearranged.
  assert qkv[...].sharding.spec == P(None, 'model')
  before = [_shard_values(params[n]['kernel']) for n in QKV]
  for device, values in _shard_values(qkv[...]).items():
    assert values == set().union(*(b[device] for b in before))
  assert _shard_values(out[...]) == _shard_values(params['out']['kernel'])


def test_fused_kernels_convert_back_exactly():
  variables = linen_variables(Attention())
  paths = fused_rules()
  with nn.logical_axis_rules(RULES):
    state = linen_to_nnx(variables, paths=paths)
    back = nnx_to_linen(state, paths=paths, target=variables)
    again = linen_to_nnx(back, paths=paths)
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  for a, b in zip(jax.tree.leaves(variables, is_leaf=is_box), jax.tree.leaves(back, is_leaf=is_box)):
    assert type(a) is type(b) and getattr(a, 'names', None) == getattr(b, 'names', None)
    np.testing.assert_array_equal(nn.unbox(a), nn.unbox(b))
    assert nn.unbox(a).sharding.is_equivalent_to(nn.unbox(b).sharding, nn.unbox(a).ndim)
  for (path, a), (_, b) in zip(nnx.to_flat_state(state), nnx.to_flat_state(again)):
    np.testing.assert_array_equal(a[...], b[...], err_msg=str(path))
    assert a.get_metadata() == b.get_metadata()


@pytest.mark.parametrize('scan', [False, True])
def test_stacked_layers_fuse_into_looped_or_stacked_layers(scan):
  variables = linen_variables(Stack())
  linen = nn.unbox(variables)['params']['attention']
  paths = fused_rules(
      prefix='attention_{i}/', nnx_prefix='layers/{i}/',
      linen='attention/', nnx='layers/',
  )
  with nn.logical_axis_rules(RULES):
    state = linen_to_nnx(variables, paths=paths, scan=scan)
    back = nnx_to_linen(state, paths=paths, scan=True, target=variables)
  for i in range(LAYERS):
    qkv = state['layers']['qkv']['kernel'][...][i] if scan else state['layers'][i]['qkv']['kernel'][...]
    parts = [np.asarray(linen[n]['kernel'][i]) for n in QKV]
    expected = np.stack(parts, axis=2).reshape(E, 3 * H * D)  # (e, h, qkv, d)
    np.testing.assert_array_equal(qkv, expected)
  if scan:
    assert state['layers']['qkv']['kernel'].get_metadata()['out_sharding'] == ('layers', 'embed', 'heads')
  for a, b in zip(jax.tree.leaves(nn.unbox(variables)), jax.tree.leaves(nn.unbox(back))):
    np.testing.assert_array_equal(a, b)
    assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


def test_donated_sources_are_freed_once_fused():
  variables = linen_variables(Attention())
  params = nn.unbox(variables)['params']
  expected = {n: np.asarray(params[n]['kernel']) for n in QKV}
  with nn.logical_axis_rules(RULES):
    state = linen_to_nnx(variables, paths=fused_rules(), donate=True)
  assert all(params[n]['kernel'].is_deleted() for n in QKV)
  fused = np.asarray(state['qkv']['kernel'][...]).reshape(E, H, 3, D)
  for p, n in enumerate(QKV):
    np.testing.assert_array_equal(fused[:, :, p], expected[n])


def test_abstract_trees_give_abstract_transformed_leaves():
  variables = linen_variables(Attention())
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), variables)
  with nn.logical_axis_rules(RULES):
    state = linen_to_nnx(abstract, paths=fused_rules())
  value = state['qkv']['kernel'].get_value()
  assert isinstance(value, jax.ShapeDtypeStruct) and value.shape == (E, 3 * H * D)
  assert value.sharding.spec == P(None, 'model')


def test_relayout_within_one_framework_does_not_transform():
  variables = linen_variables(Stack())
  paths = fused_rules(prefix='attention_{i}/', nnx_prefix='layers/{i}/', linen='attention/', nnx='layers/')
  with nn.logical_axis_rules(RULES):
    looped = relayout(variables, scan=False, paths=paths)
  assert looped['params']['attention_1']['query']['kernel'].value.shape == (E, H, D)


def test_parts_heads_behind_the_part_axis_cannot_keep_their_sharding():
  variables = linen_variables(Attention())
  with nn.logical_axis_rules(RULES), pytest.raises(
      AnnotationError, match=r"query/kernel: Rearrange\('e h d -> e \(qkv h d\)', h=4\) cannot carry "
      r"the sharding of axis h \(named 'heads'\)"
  ):
    linen_to_nnx(variables, paths=fused_rules(pattern='e h d -> e (qkv h d)'))
  # The same layout is fine where the heads shard nothing.
  replicated = (('embed', None), ('heads', None))
  variables = linen_variables(Attention(), replicated)
  with nn.logical_axis_rules(replicated):
    state = linen_to_nnx(variables, paths=fused_rules(pattern='e h d -> e (qkv h d)'))
  parts = [np.asarray(nn.unbox(variables)['params'][n]['kernel']).reshape(E, H * D) for n in QKV]
  np.testing.assert_array_equal(state['qkv']['kernel'][...], np.concatenate(parts, axis=1))


def test_a_split_the_mesh_cannot_divide_is_refused():
  variables = linen_variables(Attention())
  with nn.logical_axis_rules(RULES):
    state = linen_to_nnx(variables, paths=fused_rules())
  two_heads = PathMapping([PathRule('out/kernel', 'out/kernel', transform=Rearrange('h d e -> (h d) e', h=2))], keep_unmatched=True)
  with nn.logical_axis_rules(RULES), pytest.raises(
      AnnotationError, match=r"out/kernel: dimension 0 of size 2 is not divisible by mesh axis 'model' of size 4.*cannot follow"
  ):
    nnx_to_linen(nnx.State({'out': state['out']}), paths=two_heads)


def test_missing_parts_and_shapes_the_pattern_misreads_are_refused():
  variables = linen_variables(Attention())
  without_key = jax.tree.map(lambda x: x, variables, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  del without_key['params']['key']
  with nn.logical_axis_rules(RULES), pytest.raises(StructureError, match='parts of fused parameters are missing: key/kernel'):
    linen_to_nnx(without_key, paths=fused_rules())
  wrong = PathMapping([PathRule('out/kernel', 'out/kernel', transform=Rearrange('h d e -> (h d) e', h=3))], keep_unmatched=True)
  with nn.logical_axis_rules(RULES), pytest.raises(ShapeError, match=r'out/kernel: a dimension of size 4 cannot be \(h\)'):
    linen_to_nnx(variables, paths=wrong)


def test_a_stacked_transformed_parameter_without_layers_is_refused_not_dropped():
  paths = PathMapping([PathRule(
      tuple(f'Block_{{i}}/{n}/kernel' for n in QKV), 'layers/{i}/qkv/kernel',
      linen_stacked=tuple(f'Block/{n}/kernel' for n in QKV), nnx_stacked='layers/qkv/kernel',
      transform=Rearrange('e h d -> e (h qkv d)', h=H),
  )])
  empty = {'params': {'Block': {n: {'kernel': jnp.zeros((0, E, H, D))} for n in QKV}}}
  with pytest.raises(LayoutError, match=r'Block/query/kernel: a stacked parameter of shape \(0, 8, 4, 2\) has no layers to unstack'):
    linen_to_nnx(empty, paths=paths, scan=False)
  stacked = linen_to_nnx(empty, paths=paths)  # kept stacked: an empty stack, rearranged
  assert stacked['layers']['qkv']['kernel'].shape == (0, E, 3 * H * D)
