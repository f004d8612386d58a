"""Where two programs part: the first operation each computes that the other
does not, named with the line of the code that traced it; nothing where they
compute alike."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from converters.inference.parting import describe, first_parting, parting_words
from tests.converters.inference.test_dataflow import W, X, graph


def test_programs_that_compute_alike_do_not_part():
  a, b = graph(lambda w, x: jnp.tanh(x @ w), W, X), graph(lambda w, x: jnp.tanh(jnp.dot(x, w) * 1.0), W, X)
  assert first_parting(a, b) == (None, None) and parting_words(a, b) == ''


def test_the_first_operation_apart_is_named_on_each_side_not_what_follows_it():
  a = graph(lambda w, x: jnp.sum(jnp.exp(x @ w) + 1.0), W, X)
  b = graph(lambda w, x: jnp.sum(jnp.tanh(x @ w) + 1.0), W, X)
  first = first_parting(a, b)
  assert [g.origins[n][0].primitive.name for g, n in zip((a, b), first)] == ['exp', 'tanh']
  assert describe(a, first[0]).startswith('`exp` at ') and 'test_parting.py:' in describe(a, first[0])


def test_an_operation_inlined_from_a_library_call_points_at_the_line_that_called_it():
  a = graph(lambda w, x: jax.nn.elu(x @ w), W, X)  # `jax.nn.elu` is a jit of JAX's own
  b = graph(lambda w, x: jax.nn.relu(x @ w), W, X)
  words = parting_words(a, b)
  assert words.count('test_parting.py:') == 2, words
