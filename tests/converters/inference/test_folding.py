"""`fold` writes the rules a person would write, and never a template that
also names a path paired otherwise."""

from __future__ import annotations

from converters.inference.folding import REVERSED, fold, fold_paths, stacked_rules
from converters.paths import PathMapping, PathRule


def test_layers_fold_into_one_template():
  pairs = [((f'Dense_{i}', 'kernel'), ('layers', i, 'kernel')) for i in range(3)]
  assert fold(pairs) == [PathRule('Dense_{i}/kernel', 'layers/{i}/kernel')]


def test_keys_holding_a_slash_fold_with_them_whole():
  # Orbax and Flax keep such keys (`'a/b'`): a template must name them as
  # `format_path` does, not split them into two keys.
  pairs = [((f'enc/dec', f'block/{i}', 'kernel'), ('enc/dec', 'blocks', i, 'kernel')) for i in range(3)]
  (rule,) = fold(pairs)
  assert (rule.linen, rule.nnx) == ("'enc/dec'/'block/{i}'/kernel", "'enc/dec'/blocks/{i}/kernel")
  mapping = PathMapping([rule])
  for linen, nnx in pairs:
    (match,) = mapping.match_all('linen', linen)
    assert match.rule.path('nnx', match.layout, match.index) == nnx
  assert fold_paths([('a/b', 'x_0'), ('a/b', 'x_1')]) == ["'a/b'/x_{i}"]


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


def test_stacked_layers_paired_in_order_are_one_rule():
  pairs = [((('ScanBlock_0', 'kernel'), i), (('blocks', i, 'kernel'), None)) for i in range(3)]
  rules, plain, problems = stacked_rules(pairs)
  assert rules == [PathRule(None, 'blocks/{i}/kernel', linen_stacked='ScanBlock_0/kernel')]
  assert plain == [] and problems == []
  both = [((('ScanBlock_0', 'kernel'), i), (('blocks', 'kernel'), i)) for i in range(3)]
  assert stacked_rules(both) == ([], [(('ScanBlock_0', 'kernel'), ('blocks', 'kernel'))], [])


def test_stacked_layers_paired_last_to_first_are_refused_saying_so():
  # No rule reverses the order of layers: a port that runs them backwards
  # is refused, named as such, never converted layer i to layer i.
  looped = [((('ScanBlock_0', 'kernel'), i), (('blocks', 2 - i, 'kernel'), None)) for i in range(3)]
  rules, _, problems = stacked_rules(looped)
  assert rules == []
  assert problems == [
      f'linen ScanBlock_0/kernel (stacked): its layers pair with nnx blocks/{{i}}/kernel {REVERSED} '
      '(layer i with blocks/{2 - i}/kernel)'
  ]
  both = [((('ScanBlock_0', 'kernel'), i), (('blocks', 'kernel'), 2 - i)) for i in range(3)]
  rules, plain, problems = stacked_rules(both)
  assert rules == [] and plain == []
  assert problems == [
      f'linen ScanBlock_0/kernel and nnx blocks/kernel (both stacked): their layers pair {REVERSED} '
      '(layer i with layer 2 - i)'
  ]


def test_stacked_layers_paired_in_no_order_are_refused_listing_them():
  shuffled = [((('ScanBlock_0', 'kernel'), i), (('blocks', (i + 1) % 3, 'kernel'), None)) for i in range(3)]
  rules, _, (problem,) = stacked_rules(shuffled)
  assert rules == [] and REVERSED not in problem
  assert '0: blocks/1/kernel, 1: blocks/2/kernel, 2: blocks/0/kernel' in problem


def test_a_partial_crossing_of_stacked_layers_is_not_called_a_reversal():
  # Layers 0 and 2 of a 4-layer stack crossed, the rest paired elsewhere:
  # refused, but no order explains it.
  pairs = [((('ScanBlock_0', 'kernel'), i), (('blocks', 'kernel'), j)) for i, j in ((0, 2), (2, 0))]
  pairs += [((('ScanBlock_0', 'kernel'), 1), (('layers', 1, 'kernel'), None))]
  pairs += [((('ScanBlock_0', 'kernel'), 3), (('layers', 3, 'kernel'), None))]
  rules, plain, problems = stacked_rules(pairs)
  assert rules == [] and plain == [] and problems
  assert not any(REVERSED in p for p in problems)


def test_one_sides_paths_fold_into_a_template_that_names_nothing_else():
  own = [('blocks', '0', 'pos'), ('blocks', '1', 'pos'), ('head', 'table')]
  assert fold_paths(own) == ['blocks/{i}/pos', 'head/table']
  # A template that would name a path another rule holds is not written.
  assert fold_paths(own, [('blocks', '2', 'pos')]) == ['blocks/0/pos', 'blocks/1/pos', 'head/table']
  assert fold_paths([('blocks', '0', 'pos')]) == ['blocks/0/pos']
