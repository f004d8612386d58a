"""`placement`: where a port holds the modules a class creates, from plain
data per creation site, for instances of any configuration."""

from __future__ import annotations

import jax.numpy as jnp
import libcst as cst
import pytest
from flax import linen as nn

from converters.port import class_writing, source, tracing
from converters.port.placement import CreationSites, Held, Inside, Placement
from tests.converters.port import linen_models
from tests.converters.port.golden import sequential_compact


def _head(x, features: int):
  return nn.Dense(features)(x)  # made by a function of the file the method calls


class Loop(nn.Module):
  layers: int
  numbered: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(3)(x)
    for i in range(self.layers):
      x = nn.Dense(3, name=f'block{self.layers - i}' if self.numbered else None)(x)  # counting down
    return _head(x, 2)


class Stages(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(3):
      x = nn.Sequential([nn.Dense(3), nn.relu])(x)
    return x


def _traced(module, width: int = 3) -> tracing.Created:
  root, _ = tracing.trace(module, jnp.ones((2, width)))
  return root


def _sites(cls: type) -> CreationSites:
  file = source.file_of(cls)
  method = next(s for s in file.class_def(cls).body.body if isinstance(s, cst.FunctionDef))
  return CreationSites.of(file, method)


def _placement_of_loop(root: tracing.Created, numbered=None) -> Placement:
  sites = _sites(Loop)
  first, *looped, head = root.children
  return Placement(sites, {
      sites.site_of(first): Held('dense', False),
      sites.site_of(looped[0]): Held('layers', True, numbered),
      sites.site_of(head): Held('head', False),
  })


def test_a_module_a_function_of_the_file_made_is_at_the_methods_call_of_it():
  root = _traced(Loop(layers=2))
  head = root.children[-1]
  sites = _sites(Loop)
  assert head.site != sites.site_of(head)  # made in `_head`, placed where the method calls it
  assert sites.site_of(head) in head.stack
  assert len({sites.site_of(c) for c in root.children}) == 3


def test_each_site_is_an_attribute_and_a_loops_modules_are_listed_in_the_order_made():
  root = _traced(Loop(layers=2))
  placed = _placement_of_loop(root)
  assert [placed.nnx_path(c) for c in root.children] == [('dense',), ('layers', 0), ('layers', 1), ('head',)]
  assert [placed.loop_index_at(c) for c in root.children[1:3]] == [1, 1]
  assert [placed.made_in_loop(placed.site_of(c)) for c in root.children] == [False, True, True, False]


def test_a_plan_of_one_configuration_places_the_modules_of_another():
  # (`PATHS` is mapped for configurations traced after the class was written.)
  placed = _placement_of_loop(_traced(Loop(layers=2)))
  longer = _traced(Loop(layers=5))
  assert [placed.nnx_path(c) for c in longer.children] == (
      [('dense',)] + [('layers', k) for k in range(5)] + [('head',)])


def test_a_list_numbered_by_its_linen_names_is_indexed_by_them():
  root = _traced(Loop(layers=3, numbered=True))
  assert [c.name for c in root.children[1:4]] == ['block3', 'block2', 'block1']
  placed = _placement_of_loop(root, numbered=('block', 1))
  assert [placed.nnx_path(c) for c in root.children[1:4]] == [('layers', 2), ('layers', 1), ('layers', 0)]


def test_a_module_made_as_another_creations_argument_is_inside_the_one_made_alike():
  root = _traced(Stages())
  sites = _sites(Stages)
  dense = [c for c in root.children if c.cls is nn.Dense]
  sequential = [c for c in root.children if c.cls is nn.Sequential]
  assert len(dense) == len(sequential) == 3
  outer = sites.site_of(sequential[0])
  placed = Placement(sites, {outer: Held('stages', True)},
                     {sites.site_of(dense[0]): Inside(outer, ('layers', 0))})
  assert [placed.nnx_path(c) for c in dense] == [('stages', k, 'layers', 0) for k in range(3)]
  assert [placed.loop_index_at(c) for c in dense] == [1, 1, 1]  # the Sequential's index, not the layer's
  assert placed.made_in_loop(sites.site_of(dense[0]))


# The placement the writers leave (`ClassWriter.written_placement`), on models
# whose ports are proven (the golden `sequential_compact`, nightly).


def _written(model) -> tuple[tracing.Created, dict]:
  root, variables = tracing.trace(model.module, *model.args, **model.kwargs)
  instances: dict = {}
  for instance in root.walk():
    instances.setdefault(instance.cls, []).append(instance)
  return root, class_writing.write_classes(root, instances, variables, {}, {}).ports


@pytest.mark.nightly  # CI: test_generate.py::test_setup_modules_keep_their_attributes_and_lists_become_nnx_lists
def test_a_setup_list_is_indexed_by_its_linen_names():
  root, ports = _written(linen_models.setup_stack(num_heads=3))
  placed = ports[linen_models.SetupStack].placement
  heads = [c for c in root.children if c.name.startswith('heads_')]
  assert placed.held[placed.site_of(heads[0])] == Held('heads', True, ('heads_', 0))
  assert {c.name: placed.nnx_path(c) for c in root.children} == {
      'heads_0': ('heads', 0), 'heads_1': ('heads', 1), 'heads_2': ('heads', 2),
      'norm': ('norm',), 'dropout': ('dropout',), 'head': ('head',)}


@pytest.mark.nightly  # CI: test_golden.py's sequential_compact (its PATHS)
def test_layers_of_a_sequential_made_in_a_loop_are_inside_the_sequential_made_alike():
  root, ports = _written(sequential_compact.model(depth=3))
  placed = ports[sequential_compact.Tower].placement
  # (The paths of PATHS, proven: a Dense of the head at `head/layers/2`.)
  paths = {c.name: placed.nnx_path(c) for c in root.children if c.cls not in (nn.Dropout, nn.Sequential)}
  assert paths == {
      'Dense_0': ('dense_0',), 'Block_0': ('sequentials', 0, 'layers', 0),
      'Block_1': ('sequentials', 1, 'layers', 0), 'Block_2': ('sequentials', 2, 'layers', 0),
      'Dense_1': ('head', 'layers', 0), 'Dense_2': ('head', 'layers', 2)}
  block = next(c for c in root.children if c.name == 'Block_1')
  assert placed.loop_index_at(block) == 1 and placed.made_in_loop(placed.site_of(block))
  assert placed.site_of(block) in placed.inside and placed.site_of(block) not in placed.held
