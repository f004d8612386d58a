"""Value transforms of path rules, for ports that changed a parameter's shape.

A `Rearrange` says how a parameter's array in Linen becomes its array in NNX,
as an einops-style pattern (Linen side on the left): `'e h d -> e (h d)'` is
a `DenseGeneral` kernel (E, H, D) ported to an `nnx.Linear` kernel (E, H*D);
`'i o -> o i'` a transpose; `'e h d -> e (qkv h d)'` separate query, key and
value kernels fused into one (`qkv` names the axis that stacks the parts, so
it appears on the fused side only, and the rule lists one path per part on
the other side). Every pattern reads both ways: the sizes needed to split a
merged axis are given (`Rearrange('e h d -> e (h d)', h=8)`), so the rule is
reversible without looking at a target.

The sharding annotation follows the axes: a name travels with its axis, a
split axis's name goes to the leading part of the split, a merged axis keeps
its leading axis's name. Where that is not the same layout on the devices
(an axis other than the leading one of a merged group is sharded, the stacked
part axis is sharded) the conversion refuses rather than reshard silently.
The arrays are rearranged by `jnp` reshapes and transposes inside the
conversion's `jax.jit`, on device.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax.numpy as jnp

from converters.errors import AnnotationError, PathMappingError, ShapeError

Framework = Literal['linen', 'nnx']
_TOKEN = re.compile(r'\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<open>\()|(?P<close>\)))')


def _parse_side(text: str, pattern: str) -> tuple[tuple[str, ...], ...]:
  groups: list[tuple[str, ...]] = []
  group: list[str] | None = None
  position = 0
  text = text.rstrip()
  while position < len(text):
    m = _TOKEN.match(text, position)
    if not m:
      raise PathMappingError(
          f'Rearrange({pattern!r}): cannot read {text[position:].strip()!r}; write axis '
          "names (letters, digits, _) and parenthesised groups, e.g. 'e h d -> e (h d)'"
      )
    position = m.end()
    if m['name']:
      (groups.append((m['name'],)) if group is None else group.append(m['name']))
    elif m['open']:
      if group is not None:
        raise PathMappingError(f'Rearrange({pattern!r}): groups do not nest')
      group = []
    else:
      if not group:
        raise PathMappingError(f'Rearrange({pattern!r}): an empty or unopened group')
      groups.append(tuple(group))
      group = None
  if group is not None:
    raise PathMappingError(f'Rearrange({pattern!r}): a group is not closed')
  return tuple(groups)


class Rearrange:
  """A parameter's Linen array -> its NNX array, and back: see the module docstring.

  Args:
    pattern: `'<linen axes> -> <nnx axes>'`; parentheses merge axes.
    **sizes: the size of axes a merged group cannot tell by itself: all but
      one axis of every group, on either side (the part axis counts the
      rule's paths and needs none).
  """

  def __init__(self, pattern: str, **sizes: int):
    if not isinstance(pattern, str) or pattern.count('->') != 1:
      raise PathMappingError(
          f'Rearrange({pattern!r}): write one arrow between the Linen and the NNX '
          "axes, e.g. 'e h d -> e (h d)'"
      )
    self.pattern = ' -> '.join(' '.join(s.split()) for s in pattern.split('->'))
    left, right = pattern.split('->')
    self.linen_groups = _parse_side(left, pattern)
    self.nnx_groups = _parse_side(right, pattern)
    for side, groups in (('Linen', self.linen_groups), ('NNX', self.nnx_groups)):
      axes = [a for g in groups for a in g]
      repeated = sorted({a for a in axes if axes.count(a) > 1})
      if repeated:
        raise PathMappingError(f'Rearrange({pattern!r}): axes {repeated} appear twice on the {side} side')
    linen_axes = {a for g in self.linen_groups for a in g}
    nnx_axes = {a for g in self.nnx_groups for a in g}
    only_linen, only_nnx = sorted(linen_axes - nnx_axes), sorted(nnx_axes - linen_axes)
    #: The axis that stacks the parts of a fused parameter, and the side it is on.
    self.part_axis: str | None = None
    self.fused_side: Framework | None = None
    if len(only_linen) + len(only_nnx) > 1 or (only_linen and only_nnx):
      raise PathMappingError(
          f'Rearrange({pattern!r}): axes {only_linen} are only on the Linen side and '
          f'{only_nnx} only on the NNX side; every axis must be on both sides, except '
          'one part axis on the fused side of a fuse/split rule'
      )
    if only_linen or only_nnx:
      self.part_axis = (only_linen or only_nnx)[0]
      self.fused_side = 'linen' if only_linen else 'nnx'
    bad = {k: v for k, v in sizes.items() if k not in linen_axes | nnx_axes or k == self.part_axis}
    if bad:
      raise PathMappingError(
          f'Rearrange({pattern!r}): sizes {bad} name no axis of the pattern (the part '
          'axis is sized by the number of paths the rule lists)'
      )
    wrong = {k: v for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
    if wrong:
      raise PathMappingError(f'Rearrange({pattern!r}): sizes {wrong} must be positive ints')
    self.sizes = tuple(sorted(sizes.items()))
    for groups in (self.linen_groups, self.nnx_groups):
      for group in groups:
        unknown = [a for a in group if a not in sizes and a != self.part_axis]
        if len(unknown) > 1:
          raise PathMappingError(
              f'Rearrange({pattern!r}): the merged axis ({" ".join(group)}) cannot be split '
              f'back without the sizes of all but one of {unknown}; give them, e.g. '
              f'Rearrange({self.pattern!r}, {unknown[0]}=...)'
          )

  def __repr__(self) -> str:
    sizes = ''.join(f', {k}={v}' for k, v in self.sizes)
    return f'Rearrange({self.pattern!r}{sizes})'

  def __eq__(self, other) -> bool:
    if not isinstance(other, Rearrange):
      return NotImplemented
    return (self.pattern, self.sizes) == (other.pattern, other.sizes)

  def __hash__(self) -> int:
    return hash((self.pattern, self.sizes))

  def groups(self, framework: Framework) -> tuple[tuple[str, ...], ...]:
    return self.linen_groups if framework == 'linen' else self.nnx_groups

  def is_parted(self, framework: Framework) -> bool:
    """Whether `framework` holds the parameter as separate parts."""
    return self.part_axis is not None and framework != self.fused_side

  def _order(self, framework: Framework) -> list[str]:
    """The elementary axes of `framework`'s array(s), part axis first where parted."""
    axes = [a for g in self.groups(framework) for a in g]
    return [self.part_axis] + axes if self.is_parted(framework) else axes

  # -- shapes ------------------------------------------------------------------

  def axis_sizes(
      self, source: Framework, shapes: Sequence[tuple[int, ...]], lead: int, parts: int, where: str
  ) -> dict[str, int]:
    """The size of every axis, from the source arrays' shapes and the given sizes.

    `shapes` has one shape per source array (per part where the source is
    parted); `parts` is the number of parts (the paths the rule lists on its
    parted side). `lead` leading dimensions (a stacked layer axis) are
    carried through. Raises `ShapeError` for shapes the pattern does not describe.
    """
    groups = self.groups(source)
    sizes = dict(self.sizes)
    if self.part_axis is not None:
      sizes[self.part_axis] = parts
    if len(set(shapes)) > 1:
      raise ShapeError(
          f'{where}: the parts of a fused parameter differ in shape '
          f'({", ".join(str(s) for s in shapes)}); only parts of one shape fuse',
          [where],
      )
    shape = tuple(shapes[0])
    if len(shape) != lead + len(groups):
      raise ShapeError(
          f'{where}: shape {shape} has {len(shape) - lead} dimensions, the {source} side '
          f'of {self!r} has {len(groups)}; fix the pattern or the rule\'s paths',
          [where],
      )
    for dim, group in zip(shape[lead:], groups):
      unknown = [a for a in group if sizes.get(a) is None]
      known = math.prod(sizes[a] for a in group if sizes.get(a) is not None)
      if len(unknown) == 1 and dim % known == 0:
        sizes[unknown[0]] = dim // known
      elif unknown or dim != known:
        raise ShapeError(
            f'{where}: a dimension of size {dim} cannot be ({" ".join(group)}) with '
            f'{ {a: sizes.get(a) for a in group} } in {self!r}; fix the sizes given '
            'to the Rearrange',
            [where],
        )
    return sizes

  def target_shape(self, target: Framework, sizes: dict[str, int]) -> tuple[int, ...]:
    """The shape of each target array (of each part, where the target is parted)."""
    return tuple(math.prod(sizes[a] for a in g) for g in self.groups(target))

  def target_parts(self, target: Framework, sizes: dict[str, int]) -> int:
    return sizes[self.part_axis] if self.is_parted(target) else 1

  # -- values ------------------------------------------------------------------

  def apply(self, arrays: Sequence[Any], source: Framework, lead: int, parts: int = 1, xp=jnp) -> list[Any]:
    """The target arrays (one per target part) from the source arrays (one
    per source part), on device (`jnp`) or on the host (`xp=np`)."""
    target = 'nnx' if source == 'linen' else 'linen'
    shapes = [tuple(a.shape) for a in arrays]
    sizes = self.axis_sizes(source, shapes, lead, parts, 'rearrange')
    lead_shape = shapes[0][:lead]
    x = xp.stack(arrays, axis=lead) if self.is_parted(source) else arrays[0]
    source_order, target_order = self._order(source), self._order(target)
    x = x.reshape(lead_shape + tuple(sizes[a] for a in source_order))
    permutation = tuple(range(lead)) + tuple(lead + source_order.index(a) for a in target_order)
    if permutation != tuple(range(len(permutation))):
      x = xp.transpose(x, permutation)
    if not self.is_parted(target):
      return [x.reshape(lead_shape + self.target_shape(target, sizes))]
    parts = x.reshape(lead_shape + (sizes[self.part_axis],) + self.target_shape(target, sizes))
    return [parts[(slice(None),) * lead + (p,)] for p in range(sizes[self.part_axis])]

  # -- annotations ---------------------------------------------------------------

  def target_names(
      self,
      source: Framework,
      names: tuple | None,
      is_sharded: Callable[[Any], bool],
      where: str,
  ) -> tuple | None:
    """The target's names from one source array's names (the same for every part).

    A name travels with its axis; a split axis's name goes to the split's
    leading axis; a merged axis keeps its leading axis's name. A name that
    would be merged away or land on the part axis is dropped if it shards
    nothing (`is_sharded`), and refused otherwise. Trailing `None`s are
    left out, as Flax writes a `DenseGeneral` kernel's names.
    """
    if names is None:
      return None
    target = 'nnx' if source == 'linen' else 'linen'
    groups = self.groups(source)
    if len(names) > len(groups):
      raise AnnotationError(
          f'{where}: {len(names)} sharding names {names} for the {len(groups)} axes '
          f'of the {source} side of {self!r}; give at most one name per dimension',
          [where],
      )
    padded = tuple(names) + (None,) * (len(groups) - len(names))
    axis_names: dict[str, Any] = {self.part_axis: None} if self.part_axis else {}
    for group, name in zip(groups, padded):
      axis_names.update({a: (name if k == 0 else None) for k, a in enumerate(group)})
    result = []
    for group in self.groups(target):
      result.append(axis_names[group[0]])
      for axis in group[1:]:
        self._drop(axis_names[axis], axis, f'it is merged into ({" ".join(group)}) behind '
                   f'{group[0]}, so each device would hold a mix of {group[0]} slices',
                   is_sharded, where)
    if self.is_parted(target):
      self._drop(axis_names[self.part_axis], self.part_axis, 'it is the part axis, which the '
                 'split takes apart, so one part would span devices', is_sharded, where)
    while result and result[-1] is None:
      result.pop()
    return tuple(result)

  def _drop(self, name, axis: str, why: str, is_sharded, where: str) -> None:
    if name is not None and is_sharded(name):
      raise AnnotationError(
          f'{where}: {self!r} cannot carry the sharding of axis {axis} (named {name!r}): '
          f'{why}. Put the sharded axis first in its group if the model reads it so '
          "(e.g. '(h qkv d)' rather than '(qkv h d)'), or convert with that name "
          'resolving to None (rules=...) and reshard the result with jax.device_put',
          [where],
      )


@dataclasses.dataclass(frozen=True)
class Step:
  """A `Rearrange` bound into one conversion: which way, over how many leading
  (layer) dimensions, and which target part it produces."""

  rearrange: Rearrange
  source: Framework
  lead: int
  part: int
  parts: int

  @property
  def source_arrays(self) -> int:
    """How many source arrays one application reads: one per part where the source is parted."""
    return self.parts if self.rearrange.is_parted(self.source) else 1

  def __call__(self, arrays: Sequence[Any]) -> Any:
    return self.rearrange.apply(arrays, self.source, self.lead, self.parts)[self.part]
