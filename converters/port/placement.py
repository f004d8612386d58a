"""Where a class's port holds the modules the class creates: plain data the
writer leaves, read without it.

A writer decides, per creation site of the Linen class, the attribute that
holds what is made there (`self.dense`, or a list `self.blocks`) and, for a
module made as an argument of another creation (an RNN's cell, a
Sequential's layer), where inside that one it is (`Inside`). The mapping of
`PATHS` (`emit.path_pairs`) reads this `Placement` for every instance of the
class, including the instances of configurations traced after the class was
written: so it is kept per site, and a child's place is computed from its
site and its siblings, never looked up per instance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from converters.port import helpers, source, tracing


@dataclasses.dataclass(frozen=True)
class CreationSites:
  """Which creation site of the class's creating method made a module."""

  file: source.SourceFile
  #: The lines of the method that creates the submodules (`setup`, or the
  #: compact method).
  first_line: int
  last_line: int

  @classmethod
  def of(cls, file: source.SourceFile, method) -> CreationSites:
    where = file.positions[method]
    return cls(file, where.start.line, where.end.line)

  def _in_method(self, site: tracing.Site | None) -> bool:
    return (site is not None and site.filename == self.file.path
            and self.first_line <= site.line <= self.last_line and self.file.call_at(site) is not None)

  def site_of(self, child: tracing.Created) -> tracing.Site | None:
    """Where the method creates `child`: its own site, or the call of a
    function of the file that made it; None if neither is in the method."""
    if self._in_method(child.site):
      return child.site
    if child.site is None or child.site.filename != self.file.path:
      return None
    if helpers.function_at(self.file, child.site.line) is None:
      return None
    return next((s for s in child.stack[1:] if self._in_method(s)), None)


@dataclasses.dataclass(frozen=True)
class Held:
  """The modules made at one site: `self.<attribute>`, or the list
  `self.<attribute>` of them (`in_list`), whose index is the module's order
  among its siblings made there, or, where `numbered` is `(prefix, first)`,
  read off its Linen name (`layers_2` of `('layers_', 0)` at index 2)."""

  attribute: str
  in_list: bool
  numbered: tuple[str, int] | None = None


@dataclasses.dataclass(frozen=True)
class Inside:
  """Modules made as arguments of the creation at `outer` (an RNN's cell,
  a Sequential's layer): the k-th made at this site is held at `path` inside
  the k-th made there."""

  outer: tracing.Site
  path: tuple


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where one class's port holds the modules the class creates.

  Attributes:
    sites: which site made a module.
    held: creation site -> where the modules made there are held.
    inside: creation site -> where, inside another creation's module, the
      modules made there are held; such a site has no entry in `held`.
    variable_attributes: the class's own Linen variable -> the NNX
      attribute holding it, where they differ (`self.table =
      self.param('embedding', ...)` in `setup()`).
  """

  sites: CreationSites
  held: Mapping[tracing.Site, Held]
  inside: Mapping[tracing.Site, Inside] = dataclasses.field(default_factory=dict)
  variable_attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def site_of(self, child: tracing.Created) -> tracing.Site | None:
    return self.sites.site_of(child)

  def nnx_path(self, child: tracing.Created) -> tuple:
    """Where `child`, made by any instance of the class, is in the port."""
    site = self.site_of(child)
    if site in self.inside:
      inside = self.inside[site]
      outers = self._made_at(child, inside.outer)
      return self.nnx_path(outers[self._made_at(child, site).index(child)]) + inside.path
    held = self.held[site]
    if not held.in_list:
      return (held.attribute,)
    if held.numbered is not None:
      prefix, first = held.numbered
      return (held.attribute, int(child.name.removeprefix(prefix)) - first)
    return (held.attribute, self._made_at(child, site).index(child))

  def made_in_loop(self, site: tracing.Site) -> bool:
    """Whether the port holds the modules made at `site` in a list (made
    in a loop, or as arguments of creations in a loop)."""
    if site in self.inside:
      return self.made_in_loop(self.inside[site].outer)
    return self.held[site].in_list

  def loop_index_at(self, child: tracing.Created) -> int:
    """Where in `nnx_path(child)` the index of a looped module is: last,
    or, for one made as another creation's argument, the other's."""
    site = self.site_of(child)
    path = self.nnx_path(child)
    return len(path) - 1 - (len(self.inside[site].path) if site in self.inside else 0)

  def _made_at(self, child: tracing.Created, site: tracing.Site) -> list[tracing.Created]:
    """The modules `child`'s parent made at `site`, in order."""
    return [c for c in child.parent.children if self.site_of(c) == site]
