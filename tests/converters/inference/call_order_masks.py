"""Dropout masks drawn by call order alone, for the inference tests' own
checks of a mapping in training: shares nothing with the kit's aligned keys
(`converters.training_mode`), which the checks must not share with what
they check."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax


@contextlib.contextmanager
def masks_in_call_order() -> Iterator[None]:
  """Both frameworks' dropout masks (`jax.random.bernoulli`) drawn by call
  order alone, whatever key a layer holds: the n-th mask of a call is the
  same on both sides."""
  original, count = jax.random.bernoulli, [0]

  def bernoulli(key, p=0.5, shape=None, **kwargs):
    count[0] += 1
    return original(jax.random.key(1_000 + count[0]), p, shape)

  jax.random.bernoulli = bernoulli
  try:
    yield
  finally:
    jax.random.bernoulli = original
