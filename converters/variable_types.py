"""Linen collections <-> NNX Variable types, and what has no counterpart.

Every Linen collection maps to one NNX `Variable` type: `params` <->
`nnx.Param`, `batch_stats` <-> `nnx.BatchStat`, `cache` <-> `nnx.Cache`, and
collections of your own through `collections={'name': VariableType}`. An NNX
Variable belongs to the collection of its type, or of its nearest registered
base class (a `ConstrainedParam` is a `Param`, so it is in `params`).

State Linen has no collection for because it computes it on the fly (a
positional table) is named by a one-sided rule, `PathRule.nnx_only(path)`
(`converters.paths`), and needs no collection.

Refused, with an error naming them and the option to pass: Linen
`intermediates` (and NNX `nnx.Intermediate`), which are outputs sown during
one call, not state to port; and any collection or Variable type the table
does not know.

NNX RNG state (`RngKey`, `RngCount`, the streams of `nnx.Rngs`) has no Linen
twin (Linen takes keys per call, `rngs={'dropout': key}`). Policy: it is never
written to Linen, and a conversion into an NNX target keeps the target's own.
"""

from __future__ import annotations

from collections.abc import Mapping

from flax import nnx

from converters.errors import StructureError, format_offenders
from converters.paths import format_path

#: The collections every conversion knows.
DEFAULT_COLLECTIONS: Mapping[str, type[nnx.Variable]] = {
    'params': nnx.Param,
    'batch_stats': nnx.BatchStat,
    'cache': nnx.Cache,
}
#: Collections that are outputs of one call, never converted.
_SOWN = {'intermediates': nnx.Intermediate}


class CollectionTable:
  """The collection <-> Variable type table of one conversion."""

  def __init__(self, collections: Mapping[str, type] | None = None):
    given = dict(collections or {})
    if collections is not None and not isinstance(collections, Mapping):
      raise StructureError(
          f'collections={collections!r}: pass a dict of collection name -> nnx.Variable '
          "subclass, e.g. {'ema': EMAParam}"
      )
    wrong = [
        f'{name!r}: {kind!r}' for name, kind in given.items()
        if not isinstance(name, str) or not (isinstance(kind, type) and issubclass(kind, nnx.Variable))
        or issubclass(kind, nnx.RngState)
    ]
    if wrong:
      raise StructureError(
          f'collections has entries that are not a name and an nnx.Variable subclass '
          f'(RNG state excepted): {format_offenders(wrong)}',
          wrong,
      )
    self.by_name = {**DEFAULT_COLLECTIONS, **given}
    by_type: dict[type, str] = {}
    shared = []
    for name, kind in self.by_name.items():
      if kind in by_type:
        shared.append(f'{kind.__name__} ({by_type[kind]!r} and {name!r})')
      by_type[kind] = name
    if shared:
      raise StructureError(
          f'collections give one Variable type to several collections: '
          f'{format_offenders(shared)}; give each collection its own type',
          shared,
      )
    self._by_type = by_type

  def variable_type(self, collection: str, where: str) -> type[nnx.Variable]:
    """The NNX type of a Linen collection; raises naming it if it has none."""
    if collection in self.by_name:
      return self.by_name[collection]
    if collection in _SOWN:
      raise StructureError(
          f"{where}: the '{collection}' collection holds values sown during one call, "
          'not state; leave it out of the variables you convert (apply with '
          f"mutable=['{collection}'] returns it apart)",
          [where],
      )
    raise StructureError(
        f"{where}: no NNX Variable type is known for the Linen collection "
        f"'{collection}'; pass collections={{'{collection}': VariableType}} "
        '(an nnx.Variable subclass of your own, or nnx.Variable)',
        [where],
    )

  def has_none(self, variable: nnx.Variable) -> bool:
    """Whether `variable` is a bare `nnx.Variable` of no known collection: a
    port's constant table. A subclass of the user's own names a kind of state
    (trained or kept in a collection), so it is not guessed one."""
    return type(variable) is nnx.Variable and nnx.Variable not in self._by_type

  def paths_of_none(self, model: nnx.Module) -> list[tuple]:
    """The paths of `model`'s bare Variables of no known collection (`has_none`)."""
    return [
        tuple(p) for p, v in nnx.to_flat_state(nnx.state(model))
        if isinstance(v, nnx.Variable) and self.has_none(v)
    ]

  def collection(self, variable: nnx.Variable, where: str, path: tuple | None = None) -> str | None:
    """The Linen collection of an NNX Variable (at model path `path`, for the
    fix); None for RNG state (never written)."""
    if isinstance(variable, nnx.RngState):
      return None
    if isinstance(variable, nnx.Intermediate) and nnx.Intermediate not in self._by_type:
      raise StructureError(
          f'{where}: is an nnx.Intermediate, a value sown during one call, not '
          'state; drop intermediates first (nnx.pop(model, nnx.Intermediate))',
          [where],
      )
    for kind in type(variable).__mro__:
      if kind in self._by_type:
        return self._by_type[kind]
      if kind is nnx.Variable:
        break
    name = type(variable).__name__
    raise StructureError(
        f'{where}: no Linen collection is known for the Variable type {name}',
        [where],
        fix=f"if Linen keeps it in a collection, pass collections={{'<collection name>': {name}}}; "
        'if Linen computes it on the fly (a constant table), add the rule '
        f"PathRule.nnx_only({format_path(path) if path is not None else '<its path>'!r}) to keep "
        "the target's value, or compute it in __call__ too",
    )
