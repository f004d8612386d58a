"""NNX port of `tests.converters.port.linen_models`, written by `linen-nnx port
tests.converters.port.linen_models:named_counters`.

Each class is the NNX counterpart of the Linen class of the same name;
`named_counters_nnx_paths.PATHS`, written beside this file, maps the Linen
variables onto these modules (`linen-nnx convert --paths
named_counters_nnx_paths:PATHS`).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class NamedCounter(nnx.Module):
  """A statistic named by a field (`self.variable(..., self.stat_name, ...)`)."""

  def __init__(self, stat_name: str = 'count', *, in_features: int, rngs: nnx.Rngs):
    self.stat_name = stat_name
    setattr(self, stat_name, nnx.BatchStat(jnp.ones((in_features,))))
    self.dense = nnx.Linear(in_features, 3, rngs=rngs)

  def __call__(self, x):
    v = getattr(self, self.stat_name)
    return self.dense(x * v[...])


class NamedCounters(nnx.Module):
  def __init__(self, *, in_features: int, rngs: nnx.Rngs):
    self.named_counter_0 = NamedCounter(stat_name='a', in_features=in_features, rngs=rngs)
    self.named_counter_1 = NamedCounter(stat_name='b', in_features=in_features, rngs=rngs)

  def __call__(self, x):
    return self.named_counter_0(x) + self.named_counter_1(x)
