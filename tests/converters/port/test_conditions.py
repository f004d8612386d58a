"""`converters.port.conditions`: the conditions a port learns on its configuration and input size."""

from __future__ import annotations

from converters.port import conditions


def _by_source(atoms):
  return {a.source: a for a in atoms}


def test_atoms_that_compare_the_input_size_say_so_and_those_on_the_configuration_alone_do_not():
  atoms = _by_source(conditions._atoms({('use_bias',): True, ('features',): 8}, 'size'))
  assert atoms['size != features'].reads_size and atoms['size == features'].reads_size
  assert not atoms['features != 1'].reads_size and not atoms['not use_bias'].reads_size
  assert atoms['size != features'].holds({('features',): 8}, 16)
  assert not atoms['size != features'].holds({('features',): 8}, 8)


def test_a_conjunction_or_disjunction_reads_the_size_where_either_side_does_and_evaluates_both():
  atoms = _by_source(conditions._atoms({('use_bias',): True, ('features',): 8}, 'size'))
  flag, size = atoms['use_bias'], atoms['size != features']
  either, both = flag | size, flag & size
  assert either.source == 'use_bias or size != features' and either.reads_size
  assert both.source == 'use_bias and size != features' and both.reads_size
  assert not (flag | atoms['features != 1']).reads_size
  configuration = {('use_bias',): False, ('features',): 8}
  assert either.holds(configuration, 16) and not both.holds(configuration, 16)
  assert not either.holds(configuration, 8)
