"""Tests of `converters.checks`: every refusal before any array is built, each naming every offender."""

from __future__ import annotations

import jax
import pytest

from converters import KIT_PATHS, AnnotationError, linen_to_nnx
from kit_mlp.description import ModelDescription
from kit_mlp.optimizers import make_tx
from linen_impl import train as linen_train


def test_every_target_the_mesh_cannot_shard_is_named_at_once():
  desc = ModelDescription(num_layers=2, depth=16, batch=8, use_scan=False)
  mesh = desc.make_mesh()
  with jax.set_mesh(mesh):
    params = {'params': linen_train.make_trainer(desc, mesh, make_tx('adam')).create(seed=0).params}
    with pytest.raises(AnnotationError) as refused:
      linen_to_nnx(params, paths=KIT_PATHS, scan=True, layer_partition='layers')
  assert set(refused.value.paths) == {'layers/dot1/kernel', 'layers/w2'}
  assert str(refused.value).startswith('2 leaves do not fit the target: layers/dot1/kernel: mesh axes')
