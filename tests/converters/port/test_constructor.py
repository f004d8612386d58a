"""`converters.port.constructor`: the port's `__init__` written from its
plan (plain data in, source out, no trace), and the plan a traced class
gives."""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import libcst as cst
import pytest
from flax import linen as nn

from converters import LinenModel
from converters.port import classes, constructor, generate, syntax
from converters.port.constructor import (
  ConstructorParameter,
  ConstructorPlan,
  InputParameter,
  ModuleConstant,
  ParameterKind,
)

FIELD, INPUT, DTYPE, RNGS = ParameterKind.FIELD, ParameterKind.INPUT, ParameterKind.DTYPE, ParameterKind.RNGS


def _written(plan: ConstructorPlan, body: str = '') -> str:
  statements = list(cst.parse_module(textwrap.dedent(body)).body) if body else []
  return cst.Module([constructor.write_init(plan, statements)]).code


def test_fields_come_first_with_their_defaults_then_the_rest_by_keyword():
  plan = ConstructorPlan(
      parameters=(
          ConstructorParameter('features', FIELD, 'int', '8'),
          ConstructorParameter('kernel_init', FIELD, 'Callable', 'default_kernel_init'),
          ConstructorParameter('x_shape', INPUT, 'tuple[int, ...]'),
          ConstructorParameter('x_dtype', DTYPE, 'jnp.dtype', 'jnp.float32'),
          ConstructorParameter('rngs', RNGS, 'nnx.Rngs'),
      ),
      fields=('features', 'kernel_init'), stored=('features',),
  )
  assert _written(plan) == (
      'def __init__(self, features: int = 8, kernel_init: Callable = default_kernel_init, *, '
      'x_shape: tuple[int, ...], x_dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):\n'
      '    self.features = features\n'
  )


def test_the_creations_read_fields_as_arguments_unless_they_rebind_them():
  plan = ConstructorPlan(
      parameters=(ConstructorParameter('features', FIELD, 'int'), ConstructorParameter('conv', FIELD, 'Any'),
                  ConstructorParameter('rngs', RNGS, 'nnx.Rngs')),
      fields=('features', 'conv', 'train'), keeps_rngs=True,
  )
  written = _written(plan, '''\
      conv = partial(self.conv, use_bias=False)
      self.dense = nnx.Linear(3, self.features, rngs=rngs)
      self.other = self.features_of(self.train)
  ''')
  assert written == (
      'def __init__(self, features: int, conv: Any, *, rngs: nnx.Rngs):\n'
      '    self.rngs = rngs\n'
      '    conv = partial(self.conv, use_bias=False)\n'  # rebound: the attribute stays
      '    self.dense = nnx.Linear(3, features, rngs=rngs)\n'
      '    self.other = self.features_of(train)\n'
  )


def test_the_plan_is_plain_data():
  plan = ConstructorPlan((ConstructorParameter('rngs', RNGS, 'nnx.Rngs'),), (InputParameter('in_features', 0, 2, False),),
                         (ModuleConstant('default_init', 'normal(0.1)'),))
  assert plan == ConstructorPlan((ConstructorParameter('rngs', RNGS, 'nnx.Rngs'),),
                                 (InputParameter('in_features', 0, 2, False),), (ModuleConstant('default_init', 'normal(0.1)'),))
  assert plan.of_kind(RNGS) == (ConstructorParameter('rngs', RNGS, 'nnx.Rngs'),) and not plan.of_kind(FIELD)
  with pytest.raises(AttributeError):
    plan.keeps_rngs = True  # frozen


@pytest.mark.parametrize('annotation, default, expected', [
    ('int', '3', 'int'),
    ('int', 'None', 'int | None'),
    ('Optional[int]', 'None', 'Optional[int]'),
    ('int | None', 'None', 'int | None'),
    ('Any', 'None', 'Any'),
    ('a | b', 'None', 'a | b'),  # left as written
    ("'Block'", 'None', "'Block'"),
])
def test_a_field_defaulting_to_none_is_annotated_optional(annotation, default, expected):
  written = constructor.optional_if_none(cst.Annotation(syntax.expression(annotation)), syntax.expression(default))
  assert syntax.code_of(written.annotation) == expected


class _Scaled(nn.Module):
  features: int = 4
  scale_init: nn.initializers.Initializer = nn.initializers.normal(stddev=0.1)
  deterministic: bool = True

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', self.scale_init, (x.shape[-1],), x.dtype)
    y = nn.Dense(self.features)(x * scale)
    return nn.Dropout(0.5)(y, deterministic=self.deterministic)


def test_a_traced_class_gives_its_plan():
  _, ports = generate.write(LinenModel(_Scaled(), jnp.ones((2, 3))), factory='m:f', module_name='m_nnx',
                            test_name='t.py')
  (port,) = [p for p in ports.values() if isinstance(p, classes.ClassPort)]
  plan = port.constructor
  assert [(p.name, p.kind) for p in plan.parameters] == [
      ('features', FIELD), ('scale_init', FIELD), ('in_features', INPUT), ('x_dtype', DTYPE), ('rngs', RNGS)]
  # The computed default read from a module constant; the mode flag left
  # to `model.train()` / `.eval()`, neither taken nor stored.
  assert plan.constants == (ModuleConstant('default_scale_init', 'nn.initializers.normal(stddev=0.1)'),)
  assert plan.of_kind(FIELD)[1].default == 'default_scale_init'
  assert plan.stored == ('features', 'scale_init') and plan.inputs == (InputParameter('in_features', 0, 2, False),)
