"""A running variable for the input sizes of a loop's layers.

Where each layer a loop makes takes the output size of the creation before
it (Flax's `for features in self.widths: x = nn.Dense(features)(x)`), or a
layer right after such a loop does, the constructor keeps the size in a
variable set before the loop and after each creation in it (`in_features =
features`): the sizes then hold for any number of iterations, where the
traced sizes hold for the traced number only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from converters.port import layers, syntax, tracing

if TYPE_CHECKING:
  from converters.port.input_sizes import InputSizes


def running_size(sizes: InputSizes, node, children, values, uniform: bool) -> str | None:
  """The running variable for the input size of `node`'s `children` (their
  traced sizes `values`; `uniform`: one size at every creation), made for
  the loop around it (`sizes.running`) the first time; None where the
  sizes do not chain so."""
  if not children:
    return None
  writer = sizes.writer
  order = list(writer.symbolic.root.children)
  loops = writer.loops_around(node)
  previous_loops = []
  for k, (child, value) in enumerate(zip(children, values)):
    index = order.index(sizes.symbolic_child(child))
    if index == 0:
      if loops and k == 0:
        continue
      return None
    before = order[index - 1]
    if k == 0:
      previous_loops = _loops_before(sizes, order, index)
      # The first layer of the loop starts from what came before it; any
      # other chains from the layer before it in the loop (two streams in
      # one loop do not).
      if loops and not (previous_loops and previous_loops[-1] is loops[-1]):
        continue
    out = sizes.out_size(before)
    if out is None or str(out) != str(value):
      return None
  if loops:
    return _loop_variable(sizes, loops[-1], values[0], uniform)
  if previous_loops and id(previous_loops[-1]) in sizes.running:
    return sizes.running[id(previous_loops[-1])][1]
  return None


def _loops_before(sizes: InputSizes, order: list[tracing.Created], index: int) -> list:
  """The loops around the creation made before `order[index]`, past layers
  that keep their input's size (a dropout, a norm after the loop): the
  loop's running size is theirs too."""
  writer = sizes.writer
  made = index - 1
  while made > 0 and _keeps_size(sizes, order[made]):
    made -= 1
  made_before = next((c for c in writer.instance.children if c.name == order[made].name), None)
  if made_before is not None and writer.site_of(made_before) in writer.sites:
    return writer.loops_around(writer.sites[writer.site_of(made_before)][0])
  return []


def _loop_variable(sizes: InputSizes, loop, initial_value, uniform: bool) -> str | None:
  """The running variable of `loop`, from the initial size `initial_value`:
  made once, where the output size of every layer of the loop is known;
  None where it is not, or where every layer keeps the size (the size
  itself reads better)."""
  if id(loop) not in sizes.running:
    loop_sites = [site for site, (n, _) in sizes.writer.sites.items() if loop in sizes.file.ancestors(n)]
    if not all(sizes.out_source(s) is not None for s in loop_sites):
      return None
    if uniform and not any(sizes.out_source(s) for s in loop_sites):
      return None
    initial = sizes.size_source(initial_value)
    taken = syntax.names_in(sizes.writer.method)
    name = next(n for n in (['in_features'] if initial.startswith('__input_') else []) + [
        'in_size', 'size_in', 'running_size'] if n not in taken)
    sizes.running[id(loop)] = (initial, name)
  return sizes.running[id(loop)][1]


def _keeps_size(sizes: InputSizes, symbolic_child: tracing.Created) -> bool:
  """Whether a Flax layer made outside any loop gives its input's size."""
  spec = layers.layer_spec(type(symbolic_child.module))
  writer = sizes.writer
  made = next((c for c in writer.instance.children if c.name == symbolic_child.name), None)
  return (spec is not None and spec.out_features is None and spec.sequence_field is None and made is not None
          and writer.site_of(made) in writer.sites and not writer.loops_around(writer.sites[writer.site_of(made)][0]))
