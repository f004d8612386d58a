"""Where a class's creating method makes its submodules: each creation site
with the expression there and the modules the traced instances made at it.
The expression creates them, or calls a function of the file that does
(`_norm(config, 'attention_norm')`), which the port writes for NNX beside
the class (`converters.port.helpers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import helpers, tracing

if TYPE_CHECKING:
  from converters.port.classes import ClassWriter

#: Creation site -> `(expression, the modules made there)`.
Sites = dict[tracing.Site, tuple[cst.Call, list[tracing.Created]]]


def read(writer: ClassWriter) -> tuple[Sites, dict[tracing.Site, helpers.HelperPort]]:
  """The creation sites of `writer`'s method, and the file's functions
  called at them that make the modules, as the port writes them, by site;
  refusing a module made otherwise (through another function, or outside
  the method)."""
  sites: Sites = {}
  helper_ports: dict[tracing.Site, helpers.HelperPort] = {}
  for child in (c for instance in writer.instances for c in instance.children):
    site = writer.site_of(child)
    node = writer.file.call_at(site) if site else None
    if site is not None and site != child.site:
      function = helpers.function_at(writer.file, child.site.line)
      if not (isinstance(node.func, cst.Name) and node.func.value == function.name.value):
        writer.fail(node, f'{child.cls.__name__} {child.name!r} is created by {function.name.value}(...) '
                    'through another function; port it by hand')
      if site not in helper_ports:
        helper_ports[site] = helpers.port_helper(writer.file, function, writer.cls)
    if node is None:
      writer.fail(
          writer.method,
          f'{child.cls.__name__} {child.name!r} is not created by an expression of '
          f'{writer.cls.__name__}.{writer.method.name.value} (created at {child.site}); port it by hand',
      )
    sites.setdefault(site, (node, []))[1].append(child)
  return sites, helper_ports
