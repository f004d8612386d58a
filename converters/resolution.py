"""The path mapping of a conversion, decided once.

`resolve_mapping` is the one place that reads `paths=`: what None means (every
path kept), which models `'infer'` needs and how they are given, and the
mapping inferred from them (`converters.inference`).
"""

from __future__ import annotations

from collections.abc import Mapping

from flax import nnx
from jax.sharding import Mesh

from converters import paths as path_mapping
from converters.errors import PathMappingError
from converters.inference import infer_models
from converters.linen_model import accepts_layout
from converters.paths import PathMapping, as_infer


def resolve_mapping(
    paths,
    *,
    linen_model=None,
    nnx_model=None,
    default_nnx_model: nnx.Module | None = None,
    mesh: Mesh | None = None,
    rules: tuple | None = None,
    collections: Mapping[str, type] | None = None,
    both_layouts: bool = False,
) -> PathMapping:
  """The `PathMapping` a conversion uses, from its `paths=` and models.

  None keeps every path (`PathMapping.identity()`); a `PathMapping` or rules
  are used as given; `'infer'` (or `Infer(known)`) is the mapping inferred
  from the two models (`converters.inference.infer_models`), the known rules
  first. `default_nnx_model` is the NNX model at hand (the target's, or the
  input's) when `nnx_model` is not given; `both_layouts` asks for the mapping
  of both layouts (a relayout).
  """
  infer = as_infer(paths)
  if infer is None:
    if isinstance(paths, str):
      raise PathMappingError(
          f"paths={paths!r}: give a PathMapping (or PathRules), None to keep every "
          "path, or 'infer' (Infer(known_rules)) to derive the mapping from the two models"
      )
    given = [name for name, m in (('linen_model', linen_model), ('nnx_model', nnx_model)) if m is not None]
    if given:
      raise PathMappingError(
          f"{' and '.join(given)} given with paths={paths!r}: the models are read "
          "only to infer the mapping; pass paths='infer', or leave them out"
      )
    return path_mapping.resolve(paths)
  nnx_model = nnx_model if nnx_model is not None else default_nnx_model
  missing = [
      fix for model, fix in (
          (linen_model, 'linen_model=LinenModel(module, *example_inputs) (or a function returning one)'),
          (nnx_model, 'nnx_model= (the NNX model, or a function returning it)'),
      ) if model is None
  ]
  if missing:
    raise PathMappingError(
        "paths='infer' derives the mapping from what the Linen model and its "
        f"port compute; pass {' and '.join(missing)}"
    )
  if both_layouts and not (accepts_layout(linen_model) and accepts_layout(nnx_model)):
    raise PathMappingError(
        "relayout with paths='infer' needs both layouts of both models: give "
        "linen_model and nnx_model as functions with a layout parameter ('loop' "
        "or 'scan'), or infer_paths(...) of each layout joined by "
        'converters.inference.merge_layouts as paths='
    )
  return infer_models(
      linen_model, nnx_model, paths=infer.known, mesh=mesh, rules=rules, collections=collections
  )

