"""Tests of `converters.filling`: one loop fills every kind of target, checking every leaf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from converters.errors import AnnotationError, ShapeError, StructureError
from converters.filling import fill, scalar_like
from converters.metadata import Annotation
from converters.options import Options
from converters.paths import PathMapping

OPTIONS = Options(paths=PathMapping.identity())
RULES = (('embed', 'data'), ('hidden', None))


def leaf(shape, dtype=np.float32, **annotation):
  return jax.ShapeDtypeStruct(shape, dtype), Annotation(**annotation)


def test_every_mismatching_leaf_is_named_in_one_error():
  template = {('a',): leaf((2,)), ('b',): leaf((3,)), ('c',): leaf((4,))}
  produced = {('a',): leaf((2,), np.float16), ('b',): leaf((5,)), ('c',): leaf((4,))}
  with pytest.raises(ShapeError) as info:
    fill('x', template, produced, options=OPTIONS, prefix='params/')
  assert 'params/a' in str(info.value) and 'params/b' in str(info.value)
  assert 'params/c' not in str(info.value)


def test_missing_and_unexpected_paths_are_both_named():
  with pytest.raises(StructureError, match=r'lacks \[b\].*has \[c\]'):
    fill('x', {('a',): leaf((2,)), ('b',): leaf((2,))}, {('a',): leaf((2,)), ('c',): leaf((2,))}, options=OPTIONS)


def test_a_leaf_takes_the_targets_form_of_an_equivalent_annotation():
  template = {('w',): leaf((4,), names=('embed',), logical=True, rules=RULES)}
  produced = {('w',): leaf((4,), names=('data',), extra=(('note', 1),))}
  (value, annotation), = fill('x', template, produced, options=OPTIONS).values()
  assert value is produced[('w',)][0]
  assert (annotation.names, annotation.logical, annotation.extra) == (('embed',), True, (('note', 1),))


def test_an_annotation_resolving_elsewhere_is_refused():
  template = {('w',): leaf((4,), names=('embed',), logical=True, rules=RULES)}
  with pytest.raises(AnnotationError, match='w: converted annotation'):
    fill('x', template, {('w',): leaf((4,), names=(None,))}, options=OPTIONS)


def test_the_targets_own_checks_run_around_the_shape_dtype_and_annotation_check():
  calls = []
  template = {('a',): leaf((2,)), ('b',): leaf((2,))}
  fill(
      'x', template, dict(template), options=OPTIONS,
      check_kind=lambda p, name: calls.append(('kind', name)),
      check_metadata=lambda p, name, a: calls.append(('metadata', name)),
  )
  assert calls == [('kind', 'a'), ('metadata', 'a'), ('kind', 'b'), ('metadata', 'b')]

  def refuse_metadata(path, name, annotation):
    raise AnnotationError(f'{name}: refused', [name])

  with pytest.raises(ShapeError, match='a: converted shape'):
    fill('x', {('a',): leaf((2,))}, {('a',): leaf((3,))}, options=OPTIONS, check_metadata=refuse_metadata)


def test_leaves_come_in_the_templates_order_or_the_converted_one():
  template = {('a',): leaf((2,)), ('b',): leaf((2,))}
  produced = {('b',): leaf((2,)), ('a',): leaf((2,))}
  assert list(fill('x', template, produced, options=OPTIONS)) == [('a',), ('b',)]
  assert list(fill('x', template, produced, options=OPTIONS, in_produced_order=True)) == [('b',), ('a',)]


def test_scalars_take_the_targets_integer_dtype():
  template = {('count',): (jax.ShapeDtypeStruct((), np.int64 if jax.config.x64_enabled else np.int32), Annotation())}
  (value, annotation), = fill('x', template, {('count',): (jnp.asarray(3, np.int32), None)}, options=OPTIONS).values()
  assert annotation is None and int(value) == 3 and value.dtype == template[('count',)][0].dtype


@pytest.mark.parametrize('value, match', [
    (np.asarray(2**40, np.int64), 'does not fit'),
    (np.asarray(1.5, np.float32), 'not an integer'),
    (np.zeros(2, np.int32), 'expected a scalar'),
])
def test_a_scalar_that_would_change_is_refused(value, match):
  with pytest.raises(ShapeError, match=match):
    scalar_like(value, np.int32, None, 'step')
