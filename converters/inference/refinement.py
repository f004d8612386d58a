"""Pairing two models' variables by the structure of their whole computations.

Labels are refined over the union of the two dataflow graphs (colour
refinement, as in the Weisfeiler-Leman test): each round, a node's label
becomes its label with the labels of its operands and of its uses, each with
the role of the edge. Two nodes keep one label only while everything within
that many steps of them is alike, so labels are equal across the models
exactly where the computations are. Order of use, names and layer indices
play no part.

A variable pairs when its class holds it and one variable of the other
model, at some round from `SETTLING_ROUND` on (its uses, and what they
combine it with, alike): classes only split, so that is its partner, even
if a difference between the ports elsewhere reaches it later. Variables
never alone with one counterpart keep the last class in which they still had
counterparts: a group, when it holds as many of each model, for the witness
to decide; else no pair (the message lists the candidates).

Three views are refined in turn, each for the variables the others left
open, until none pairs more: labels with each node's depth from the inputs,
with its depth to the outputs, and plain labels. Depth tells the layers of a
deep stack apart in a few rounds; plain labels survive a port whose extra
step shifts every depth. Each pair settled becomes a label of its own on
both sides for the rounds after, anchoring the variables around it.

One inference builds the same two graphs again for each of its trials;
within `remembered()`, which it enters, they are paired once.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections import defaultdict
from collections.abc import Hashable, Iterator

from converters.inference.dataflow import Graph


@dataclasses.dataclass(frozen=True)
class Pairing:
  """What the structure says: settled pairs, groups it cannot split
  (`(linen keys, nnx keys)`, as many of each), and the variables of either
  side with no counterpart. Keys are `Graph.variables` keys."""

  pairs: tuple[tuple[Hashable, Hashable], ...]
  groups: tuple[tuple[tuple[Hashable, ...], tuple[Hashable, ...]], ...]
  unmatched: tuple[tuple[Hashable, ...], tuple[Hashable, ...]]


class _Union:
  """The two graphs as one: nodes of the second follow the first's."""

  def __init__(self, a: Graph, b: Graph):
    self.size = len(a.labels) + len(b.labels)
    offset = len(a.labels)
    self.labels = a.labels + b.labels
    self.edges = a.edges + [(s + offset, e, t + offset) for s, e, t in b.edges]
    self.variables = (
        {n: key for key, n in a.variables.items()},
        {n + offset: key for key, n in b.variables.items()},
    )
    edge_ids: dict = {}
    self.into = [[] for _ in range(self.size)]
    self.out = [[] for _ in range(self.size)]
    for s, e, t in self.edges:
      e = edge_ids.setdefault(e, len(edge_ids))
      self.into[t].append((e, s))
      self.out[s].append((e, t))
    self.offset = offset

  def neighbours(self) -> tuple[list, list]:
    """`into` and `out` with each edge's role as a multiple of `size`: added
    to the colour at the edge's other end (below `size`), the pair is one
    integer, so a node's neighbourhood sorts as integers, not tuples."""
    size = self.size
    return ([[(e * size, s) for e, s in edges] for edges in self.into],
            [[(e * size, t) for e, t in edges] for edges in self.out])

  def depth(self, forward: bool) -> list[int]:
    """Longest path from a source (forward) or to a sink, over edges that go
    forward in creation order (a loop's carry fed back does not count)."""
    depth = [0] * self.size
    if forward:
      for n in range(self.size):
        for _, s in self.into[n]:
          if s < n and not (s < self.offset <= n):
            depth[n] = max(depth[n], depth[s] + 1)
    else:
      for n in reversed(range(self.size)):
        for _, t in self.out[n]:
          if t > n and not (n < self.offset <= t):
            depth[n] = max(depth[n], depth[t] + 1)
    return depth


def refine(union: _Union, initial: list[Hashable], rounds: int | None = None):
  """Colour refinement from `initial` labels: yields each round's colours
  (ints; equal across the two graphs for equal structure) until stable, and
  the stable colours again up to `SETTLING_ROUND`."""
  ids: dict = {}
  colours = [ids.setdefault(label, len(ids)) for label in initial]
  count = len(ids)
  yield colours
  into, out = union.neighbours()
  done = 0
  while rounds is None or done < rounds:
    ids = {}
    colours = [
        ids.setdefault((
            colours[n],
            tuple(sorted([role + colours[s] for role, s in into[n]])) if into[n] else (),
            tuple(sorted([role + colours[t] for role, t in out[n]])) if out[n] else (),
        ), len(ids))
        for n in range(union.size)
    ]
    done += 1
    yield colours
    if len(ids) == count:
      for _ in range(done, SETTLING_ROUND):
        yield colours
      return
    count = len(ids)


#: The round from which a class of one variable of each model pairs them:
#: by then each one's uses, and what they are combined with, are alike.
SETTLING_ROUND = 2


def _follow(union: _Union, colours_by_round, open_nodes: set[int]):
  """`(pairs, groups, candidates)` of the variable nodes in `open_nodes`.

  A variable pairs when its class holds it and one variable of the other
  model at some round from `SETTLING_ROUND` on (classes only split, so its
  partner can only be that one). One that never does keeps the last class
  in which it still had counterparts: a group when it holds as many of
  each model, else its candidates (for the message)."""
  left, _ = union.variables
  pairs: dict[int, int] = {}
  last: dict[int, tuple[int, ...]] = {}
  for r, colours in enumerate(colours_by_round):
    classes: dict[int, list[int]] = defaultdict(list)
    for n in open_nodes:
      if n not in pairs:
        classes[colours[n]].append(n)
    for members in classes.values():
      a = [n for n in members if n in left]
      b = [n for n in members if n not in left]
      if not a or not b:
        continue
      if r >= SETTLING_ROUND and len(a) == len(b) == 1:
        pairs[a[0]], pairs[b[0]] = b[0], a[0]
        continue
      for n in members:
        last[n] = tuple(members)
    if len(pairs) == len(open_nodes):
      break
  groups, seen = [], set()
  for n, members in last.items():
    if n in pairs or n in seen:
      continue
    members = tuple(m for m in members if m not in pairs)
    a = tuple(m for m in members if m in left)
    b = tuple(m for m in members if m not in left)
    if n in members:
      seen.update(members)
      groups.append((a, b))
  return [(a, b) for a, b in pairs.items() if a in left], groups


#: The pairings found within `remembered()`, by the two graphs' contents.
_REMEMBERED: contextvars.ContextVar[dict | None] = contextvars.ContextVar('pairings', default=None)


@contextlib.contextmanager
def remembered() -> Iterator[None]:
  """Within it, `pair` of two graphs whose labels, edges and variables are
  those of a pair it refined before returns that pairing: one inference
  builds the same graphs again for each trial (a given rule, positions
  relaxed, a transform proposed) and would refine them again. Nested, the
  outer one's pairings are kept."""
  if _REMEMBERED.get() is not None:
    yield
    return
  token = _REMEMBERED.set({})
  try:
    yield
  finally:
    _REMEMBERED.reset(token)


def _content(graph: Graph) -> tuple:
  return tuple(graph.labels), tuple(graph.edges), tuple(graph.variables.items())


def pair(a: Graph, b: Graph) -> Pairing:
  """The pairing of `a`'s variables with `b`'s that their structure gives."""
  found = _REMEMBERED.get()
  if found is None:
    return _pair(a, b)
  key = (_content(a), _content(b))
  if key not in found:
    found[key] = _pair(a, b)
  return found[key]


def _pair(a: Graph, b: Graph) -> Pairing:
  union = _Union(a, b)
  left, right = union.variables
  open_nodes = set(left) | set(right)
  pairs: list[tuple[int, int]] = []
  labels = list(union.labels)
  depths = (union.depth(forward=True), union.depth(forward=False), None)
  groups: list = []
  progress = True
  while progress and open_nodes:
    progress = False
    for depth in depths:
      if not open_nodes:
        break
      initial = labels if depth is None else list(zip(labels, depth))
      found, groups = _follow(union, refine(union, initial), open_nodes)
      for x, y in found:
        pairs.append((x, y))
        open_nodes -= {x, y}
        # settled pairs anchor the rest: one label of their own, both sides
        labels[x] = labels[y] = ('paired', len(pairs))
        progress = True
  balanced = [(ga, gb) for ga, gb in groups if len(ga) == len(gb) >= 2]
  for ga, gb in balanced:
    open_nodes -= {*ga, *gb}
  return Pairing(
      tuple((left[x], right[y]) for x, y in pairs),
      tuple((tuple(left[x] for x in ga), tuple(right[y] for y in gb)) for ga, gb in balanced),
      (tuple(left[n] for n in sorted(open_nodes) if n in left),
       tuple(right[n] for n in sorted(open_nodes) if n in right)),
  )
