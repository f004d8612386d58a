"""Tests of `converters.inference.refinement`: pairing variables by the structure
of two dataflow graphs, and the pairings an inference remembers."""

from __future__ import annotations

from converters.inference import refinement
from converters.inference.dataflow import Graph


def _graph(first: str = 'a', roles=('lhs', 'rhs')) -> Graph:
  """`tanh(dot(x, w_a)) * w_b`: two variables of one shape used differently,
  the one named `first` created (and numbered) first, as a port may."""
  graph = Graph()
  x = graph.node(('input',))
  kernels = {}
  for slot, name in enumerate([first, 'b' if first == 'a' else 'a']):
    kernels[name] = graph.variables[(slot, None)] = graph.node(('variable', (4, 4)))
  dot = graph.node(('dot_general',), (x, roles[0]), (kernels['a'], roles[1]))
  tanh = graph.node(('tanh',), (dot, 'x'))
  graph.node(('mul',), (tanh, 'lhs'), (kernels['b'], 'rhs'))
  return graph


def test_variables_pair_by_what_they_compute_not_by_their_order():
  a, b = _graph('a'), _graph('b')
  pairing = refinement.pair(a, b)
  # The contraction's kernel is slot 0 of one and slot 1 of the other.
  assert set(pairing.pairs) == {((0, None), (1, None)), ((1, None), (0, None))}
  assert pairing.unmatched == ((), ())


def test_the_role_of_an_edge_tells_two_operands_apart():
  # A contraction reading its kernel as its left operand is another computation.
  pairing = refinement.pair(_graph(), _graph(roles=('rhs', 'lhs')))
  assert pairing.pairs == (((1, None), (1, None)),)  # the product's kernel only


def test_operands_of_one_role_are_a_multiset_in_any_order():
  a, b = Graph(), Graph()
  for graph, order in ((a, (0, 1)), (b, (1, 0))):
    x, y = graph.node(('input',)), graph.node(('variable', ()))
    graph.variables[(0, None)] = y
    operands = [(x, 'operand'), (y, 'operand')]
    graph.node(('add',), *[operands[k] for k in order])
  union = refinement._Union(a, b)
  *_, stable = refinement.refine(union, list(union.labels))
  offset = len(a.labels)
  assert [stable[n] for n in range(offset)] == [stable[n + offset] for n in range(offset)]


def test_pairings_are_remembered_by_content_within_one_inference():
  a, b = _graph('a'), _graph('b')
  assert refinement.pair(a, b) is not refinement.pair(a, b)  # outside: nothing kept
  with refinement.remembered():
    first = refinement.pair(a, b)
    assert refinement.pair(_graph('a'), _graph('b')) is first  # built again alike
    with refinement.remembered():  # nested: the outer pairings are kept
      assert refinement.pair(a, b) is first
    a.labels[a.variables[(0, None)]] = ('given', 'rule', None)  # anchored, as inference does
    assert refinement.pair(a, b) is not first
  assert refinement._REMEMBERED.get() is None
