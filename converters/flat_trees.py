"""Trees as flat maps `{path tuple: leaf}`, and back.

A path is the tuple of a leaf's keys (`('Dense_0', 'kernel')`); `keys_of`
reads it off a JAX key path, `nest` builds the nested dicts back, and
`check_array` is the rule every leaf of a converted tree obeys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import traverse_util

from converters.errors import StructureError


def key_of(k) -> Any:
  """The key of one JAX key-path entry (a dict key, attribute name or index)."""
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return getattr(k, attr)
  raise StructureError(f'unsupported pytree key {k!r}')


def never(path: tuple) -> bool:
  """The predicate no path satisfies (no state is one side's only)."""
  return False


def keys_of(keypath) -> tuple:
  """The path tuple of a JAX key path."""
  return tuple(key_of(k) for k in keypath)


def check_array(value, where: str) -> None:
  """Raises `StructureError` unless `value` is an array (or an abstract one)."""
  if value is None:
    raise StructureError(
        f'{where}: is None; every parameter must be an array (remove the entry '
        'or give it its value)',
        [where],
    )
  if not (hasattr(value, 'shape') and hasattr(value, 'dtype')) or isinstance(value, (str, bytes)):
    raise StructureError(
        f'{where}: is a {type(value).__name__}, not an array; parameters must be '
        'jax.Array, np.ndarray or jax.ShapeDtypeStruct (wrap scalars with '
        'jnp.asarray)',
        [where],
    )


def nest(flat: Mapping[tuple, Any]) -> dict:
  """Nested dicts of a flat map (Flax's `traverse_util.unflatten_dict`)."""
  return traverse_util.unflatten_dict(dict(flat))
