"""`fold` writes the rules a person would write, and never a template that
also names a path paired otherwise."""

from __future__ import annotations

from converters.inference.folding import fold
from converters.paths import PathMapping, PathRule


def test_layers_fold_into_one_template():
  pairs = [((f'Dense_{i}', 'kernel'), ('layers', i, 'kernel')) for i in range(3)]
  assert fold(pairs) == [PathRule('Dense_{i}/kernel', 'layers/{i}/kernel')]


def test_a_template_never_overlaps_a_pair_of_another_family():
  pairs = [((f'Dense_{i}', 'kernel'), ('layers', i, 'kernel')) for i in range(2)]
  pairs.append((('Dense_2', 'kernel'), ('head', 'kernel')))
  mapping = PathMapping(fold(pairs))
  for linen, nnx in pairs:
    (match,) = mapping.match_all('linen', linen)
    assert match.rule.path('nnx', match.layout, match.index) == nnx
    (match,) = mapping.match_all('nnx', nnx)
    assert match.rule.path('linen', match.layout, match.index) == linen


def test_a_template_never_names_a_reserved_path():
  pairs = {(('Dense_0', 'kernel'), ('layers', 0, 'w')): None, (('Dense_2', 'kernel'), ('layers', 2, 'w')): None}
  assert [(r.linen, r.nnx) for r in fold(pairs)] == [('Dense_{i}/kernel', 'layers/{i}/w')]
  # Dense_1 is mapped by another rule (a transform): the layers keep rules of their own.
  rules = fold(pairs, [('linen', ('Dense_1', 'kernel'))])
  assert [(r.linen, r.nnx) for r in rules] == [('Dense_0/kernel', 'layers/0/w'), ('Dense_2/kernel', 'layers/2/w')]
