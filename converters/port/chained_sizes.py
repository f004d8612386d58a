"""An input size read off the layer made before, where the instances' sizes
differ otherwise than by one expression of the fields.

big_vision's MLP block makes `Dense(self.mlp_dim or 4 * d)` then
`Dense(d)`: the second's input size is `self.dense_0.out_features` (with
`mlp_dim` None in some instances). Its ViT makes a `pre_logits` layer `if
self.rep_size:` (a flag or a width) before the head, whose input size is
then `self.pre_logits.out_features if rep_size else width`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import layers, switched_sizes, syntax, tracing

if TYPE_CHECKING:
  from converters.port.input_sizes import InputSizes


def chained_size(sizes: InputSizes, node, children, traced) -> str | None:
  """`node`'s input size read off the Flax layer made before it (past
  layers that keep it: an activation, a norm), `children` the modules made
  there and `traced` their `(symbolic child, size)`; None where that is not
  so."""
  writer = sizes.writer
  if writer.loops_around(node):
    return None
  by_site: dict = {}  # the site of the layer before (None: none) -> [(instance, size)]
  for child, (symbolic, value) in zip(children, traced):
    site = _layer_before(sizes, child, symbolic, value)
    by_site.setdefault(site, []).append((child.parent, sizes.child_size(symbolic, value)))
  if len(by_site) > 2 or None in by_site and len(by_site[None]) and len({t for _, t in by_site[None]}) > 1:
    return None
  around = set(sizes.file.ancestors_below(node, writer.method))
  written: list[tuple[str, list, cst.If | None]] = []  # (size, instances, the `if` it needs)
  for site, found in by_site.items():
    texts = {t for _, t in found}
    if len(texts) == 1:
      written.append((texts.pop(), [i for i, _ in found], None))
      continue
    out = _out_features(sizes, site, around)
    if out is None:
      return None
    size, condition = out
    written.append((size, [i for i, _ in found], condition))
  if len(written) == 1:
    size, _, condition = written[0]
    return size if condition is None else None
  return _switched(sizes, written)


def _out_features(sizes: InputSizes, site, around) -> tuple[str, cst.If | None] | None:
  """`self.<attribute>.<out_features>` of the single layer made at `site`,
  and the `if` it is made in, if any, that is not `around` the creation;
  None where the layer is not one attribute made outside a loop, or is
  made under more than one such `if`."""
  writer = sizes.writer
  if site not in writer.attributes or writer.attributes[site][1] or site in writer.inlined or writer.loops_around(
      writer.sites[site][0]):
    return None
  spec = layers.layer_spec(writer.sites[site][1][0].cls)
  conditions = [a for a in sizes.file.ancestors_below(writer.sites[site][0], writer.method)
                if isinstance(a, cst.If) and a not in around]
  if len(conditions) > 1 or conditions and writer.sites[site][0] not in syntax.descendants(conditions[0].body):
    return None
  return (f'self.{writer.attributes[site][0]}.{spec.nnx_argument(spec.out_features)}',
          conditions[0] if conditions else None)


def _switched(sizes: InputSizes, written) -> str | None:
  """`<first> if <test> else <second>` of two sizes, one of a layer made
  under an `if` on the configuration whose test takes its body for the
  instances of that size and not for the others'; None where it does not."""
  (first, first_instances, first_if), (second, second_instances, second_if) = written
  if first_if is None:
    (first, first_instances, first_if), (second, second_instances, second_if) = written[::-1]
  if first_if is None or second_if is not None:
    return None
  test = first_if.test
  if sizes.writer.call_time & syntax.names_in(test) or not (
      all(switched_sizes.test_value(sizes.file, test, i) is True for i in first_instances)
      and all(switched_sizes.test_value(sizes.file, test, i) is False for i in second_instances)):
    return None
  written_test = switched_sizes.init_test(test, sizes.file, sizes.writer.field_names)
  return None if written_test is None else f'{first} if {written_test} else {second}'


def _layer_before(sizes: InputSizes, child, symbolic, value) -> tracing.Site | None:
  """The site of the Flax layer `child`'s parent made before it (past
  layers that keep their input's size) whose output size is `value`,
  `child`'s input size; None where there is none."""
  order = list(sizes.writer.symbolic_of(child.parent).root.children)
  index = order.index(symbolic) - 1
  while index >= 0 and (spec := layers.layer_spec(type(order[index].module))) is not None \
          and spec.out_features is None and spec.sequence_field is None:
    index -= 1
  if index < 0:
    return None
  before = order[index]
  made = next((c for c in child.parent.children if c.name == before.name), None)
  spec = layers.layer_spec(type(before.module))
  if made is None or spec is None or spec.out_features is None or str(sizes.out_size(before)) != str(value):
    return None
  return sizes.writer.site_of(made)
