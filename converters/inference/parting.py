"""Where two traced programs part: the first operation of each that the other does not compute.

A node's *computation* is its label with the computations of its operands
(each through its edge's label: the operand's role), a hash of the
expression that made it whatever the variables are named. Walking each
program in order, the first operation whose computation the other program
has nowhere is where the two part: a refusal names it on both sides, with
the line of the model's own code that traced it, rather than the variables
downstream of it (whose uses differ only because of it).
"""

from __future__ import annotations

from converters import compat
from converters.inference.dataflow import Graph


def computations(graph: Graph) -> list[int]:
  """The computation of each node (operands before uses; a loop's carry,
  which feeds an earlier node, counts for nothing)."""
  into: list[list] = [[] for _ in graph.labels]
  for source, edge, target in graph.edges:
    if source < target:
      into[target].append((edge, source))
  found: list[int] = []
  for n, label in enumerate(graph.labels):
    operands = sorted((repr(edge), found[source]) for edge, source in into[n])
    found.append(hash((repr(label), tuple(operands))))
  return found


def first_parting(a: Graph, b: Graph) -> tuple[int | None, int | None]:
  """The first operation of `a` whose computation `b` has nowhere, and of
  `b` whose computation `a` has nowhere (None: none, or not an operation)."""
  ours, theirs = computations(a), computations(b)
  return _first(a, ours, set(theirs)), _first(b, theirs, set(ours))


def _first(graph: Graph, computed: list[int], other: set[int]) -> int | None:
  """The first operation on a variable or an input (not a constant, not a
  value left unused) whose computation is not in `other`."""
  connected = {t for _, _, t in graph.edges} & {s for s, _, _ in graph.edges}
  for n, value in enumerate(computed):
    operation = graph.origins[n] and graph.origins[n][0] is not None
    if operation and n in connected and n not in graph.constant and value not in other:
      return n
  return None


def describe(graph: Graph, node: int | None) -> str:
  """`'exp' at model.py:12 (__call__)` of an operation node: the line of
  the model's code that traced it, or that called the function it was
  inlined from (`jax.nn.elu` is a `jit` of JAX's own)."""
  if node is None:
    return 'nothing the other does not compute'
  eqn, *calls = graph.origins[node]
  line = next((line for e in (eqn, *calls) if (line := compat.source_line(e, own_only=True))), None)
  return f'`{eqn.primitive.name}`' + (f' at {line}' if line else '')


def parting_words(a: Graph, b: Graph) -> str:
  """Where the Linen program `a` and the NNX program `b` part, in words;
  empty where neither computes an operation the other lacks."""
  first = first_parting(a, b)
  if first == (None, None):
    return ''
  return (f'the two programs part first at Linen {describe(a, first[0])} and NNX '
          f'{describe(b, first[1])}')
