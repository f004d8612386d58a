"""Every public name of the kit is in the reference, generated from its docstring.

A public name is a name in the `__all__` of a module of `converters` or
`nnx_port`. The build fails listing each public name that no autodoc
directive documents, or whose docstring is empty, with the page to add it to:
Optax's docs build checks its public symbols the same way. A name re-exported
under several modules (`converters.infer_paths`, `converters.inference.infer_paths`)
is covered once documented under any of them: the same object under the same
name (two constants that are one object, `GUIDE_PATHS` and `KIT_PATHS`, each
need their own entry).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the tests import this module without Sphinx installed
  from sphinx.application import Sphinx

PUBLIC_PACKAGES = ('converters', 'nnx_port')


def public_names() -> dict[str, Any]:
  """`{'module.name': object}` for every name of every public module's `__all__`."""
  names = {}
  for package_name in PUBLIC_PACKAGES:
    package = importlib.import_module(package_name)
    modules = [package] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(package.__path__, package_name + '.')
    ]
    for module in modules:
      for name in getattr(module, '__all__', ()):
        names[f'{module.__name__}.{name}'] = getattr(module, name)
  return names


def resolve(full_name: str) -> Any:
  """The object a dotted name names: its longest importable module, then attributes."""
  parts = full_name.split('.')
  for split in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:split]))
    except ImportError:
      continue
    for attribute in parts[split:]:
      obj = getattr(obj, attribute)
    return obj
  raise ImportError(full_name)


def covered(name: str, obj: Any, documented: dict[str, Any]) -> str | None:
  """The documented name that covers public `name` (the object `obj`): itself,
  or the same object documented under the same short name elsewhere."""
  if name in documented:
    return name
  short = name.rsplit('.', 1)[-1]
  for other, other_obj in documented.items():
    if other.rsplit('.', 1)[-1] == short and other_obj is obj:
      return other
  return None


def _record(app: Sphinx, what, name, obj, options, lines) -> None:
  documented = app.env.public_api_documented.setdefault(app.env.docname, {})
  documented[name] = documented.get(name, False) or any(line.strip() for line in lines)


def _purge(app: Sphinx, env, docname: str) -> None:
  env.public_api_documented.pop(docname, None)


def _init(app: Sphinx) -> None:
  if not hasattr(app.env, 'public_api_documented'):
    app.env.public_api_documented = {}


def _check(app: Sphinx, exception) -> None:
  if exception is not None:
    return
  documented: dict[str, bool] = {}
  for names in app.env.public_api_documented.values():
    for name, has_text in names.items():
      documented[name] = documented.get(name, False) or has_text
  objects = {}
  for name in documented:
    try:
      objects[name] = resolve(name)
    except (ImportError, AttributeError):  # a member autodoc read off an instance
      continue
  missing, empty = [], []
  for name, obj in sorted(public_names().items()):
    other = covered(name, obj, objects)
    if other is None:
      missing.append(name)
    elif not documented[other]:
      empty.append(name)
  problems = []
  if missing:
    problems.append(
        'public names the reference leaves out (add an autodoc directive to the '
        'page of their module under docs/reference/): ' + ', '.join(missing))
  if empty:
    problems.append('public names documented without a docstring (write one): ' + ', '.join(empty))
  if problems:
    from sphinx.errors import SphinxError

    raise SphinxError('; '.join(problems))


def setup(app: Sphinx) -> dict[str, Any]:
  app.connect('builder-inited', _init)
  app.connect('env-purge-doc', _purge)
  app.connect('autodoc-process-docstring', _record)
  app.connect('build-finished', _check)
  return {'version': '1', 'parallel_read_safe': False, 'env_version': 1}
