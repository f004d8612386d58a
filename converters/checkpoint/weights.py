"""Checkpoints of weights only: the forms they take, and their standard form.

Pretrained and released weights come without optimizer state, in the form
the code that saved them had at hand. Each framework's forms, as a `Side`'s
`form` names them:

- Linen: `'variables'`, what `init` returns (`{'params': ..., 'batch_stats':
  ...}`); `'params_collection'`, `{'params': ...}` alone; `'params'`, the
  bare params tree (`flax.serialization.to_bytes(params)`, a
  `flax.training.checkpoints` save of params). Each boxed as `init` returns
  it (`nn.Partitioned`, saved with a `value` level) or bare (`nn.unbox`).
- NNX: `'model'`, `nnx.state(model)` (RNG state included, as Flax's
  checkpointing guide saves it); `'params'`, `nnx.state(model, nnx.Param)`.
  Each as Variables (saved with a `value` level) or as a pure dict
  (`nnx.to_pure_dict(state)`).

Which form a checkpoint holds is found by its structure against each form
of the models (`forms`). Every form converts through a standard one: Linen
variables with their boxes, an `nnx.State` of Variables (`standard`), so the
annotations of the models give each array its sharding whatever was saved.
What is written is the target framework's ordinary form of the same content:
everything (`'variables'` <-> `'model'`) or the parameters alone
(`{'params': ...}` <-> `nnx.state(model, nnx.Param)`), each restoring with
that framework's ordinary Orbax code.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from converters.checkpoint import inspect as checkpoints
from converters.checkpoint.sides import Side
from converters.errors import CheckpointError
from converters.metadata import is_linen_box

#: The forms of each framework, everything first.
FORMS = {'linen': ('variables', 'params_collection', 'params'), 'nnx': ('model', 'params')}
#: How each form reads in messages and summaries.
DESCRIPTIONS = {
    ('linen', 'variables'): "Linen variables, as init returns them ({'params': ..., <collections>})",
    ('linen', 'params_collection'): "Linen {'params': ...}",
    ('linen', 'params'): 'a bare Linen params tree',
    ('nnx', 'model'): 'an NNX model state (nnx.state(model))',
    ('nnx', 'params'): 'NNX parameters (nnx.state(model, nnx.Param))',
}


def describe(side: Side) -> str:
  """The form of a weights side, in words (`... , bare` / `..., pure dict`)."""
  text = DESCRIPTIONS[side.framework, side.form]
  if side.pure:
    text += ', without boxes' if side.framework == 'linen' else ', as a pure dict'
  return text


def _unboxed(tree) -> Any:
  return jax.tree.map(lambda x: x.value if is_linen_box(x) else x, tree, is_leaf=is_linen_box)


def _stored(side: Side, form: str, pure: bool) -> Any:
  """The abstract tree a `form` checkpoint of `side`'s model holds."""
  standard = side.standard
  if side.framework == 'linen':
    tree = {'variables': standard, 'params_collection': {'params': standard['params']},
            'params': standard['params']}[form]
    return _unboxed(tree) if pure else tree
  tree = standard if form == 'model' else nnx.filter_state(standard, nnx.Param)
  return nnx.to_pure_dict(tree) if pure else tree


def forms(side: Side) -> list[Side]:
  """Every form a weights checkpoint of `side`'s model may take (`side` is
  its standard form); forms that hold the same tree are listed once."""
  found, seen = [], []
  for form in FORMS[side.framework]:
    for pure in (False, True):
      stored = _stored(side, form, pure)
      structure = jax.tree.structure(stored)
      if structure in seen:  # {'params': ...} of a model with no other collection
        continue
      seen.append(structure)
      found.append(dataclasses.replace(side, abstract_state=stored, form=form, pure=pure))
  return found


def standard(side: Side, state: Any) -> Any:
  """`state` (restored in `side`'s form) in the standard form: Linen
  variables with the model's boxes around the arrays, or an `nnx.State` of
  the model's Variables holding them."""
  if side.framework == 'linen':
    tree = {'params': state} if side.form == 'params' else state
    if not side.pure:
      return tree
    boxed = {c: side.standard[c] for c in tree}
    return jax.tree.map(
        lambda box, x: box.replace_boxed(x) if is_linen_box(box) else x, boxed, tree, is_leaf=is_linen_box,
    )
  if not side.pure:
    return state
  template = side.standard if side.form == 'model' else nnx.filter_state(side.standard, nnx.Param)
  template = jax.tree.map(lambda x: x, template)  # Variables of its own to fill
  nnx.replace_by_pure_dict(template, state)
  return template


def runnable(side: Side, state: Any) -> Any:
  """What runs the model of restored weights: Linen variables, or the NNX
  model. Refused when the checkpoint lacks state the model's call needs
  (batch statistics beside `{'params': ...}`); an NNX model's RNG state,
  which no weights need, is seeded."""
  held = standard(side, state)
  if side.framework == 'linen':
    lacking = sorted(set(side.standard) - set(held))
  else:
    present = {tuple(p) for p, _ in nnx.to_flat_state(held)}
    lacking = [
        '/'.join(map(str, p)) for p, v in nnx.to_flat_state(side.standard)
        if tuple(p) not in present and not isinstance(v, nnx.RngState)
    ]
  if lacking:
    raise CheckpointError(
        f'{describe(side)} lacks state the model runs with: {", ".join(lacking)}; its '
        'outputs cannot be computed from it',
        fix='compare the leaves (without --outputs), or save every collection',
    )
  if side.framework == 'linen':
    return held
  model = nnx.merge(side.graphdef, jax.tree.map(lambda x: x, side.standard))  # Variables of its own
  nnx.update(model, held)
  streams = {v.tag for _, v in nnx.to_flat_state(nnx.state(model, nnx.RngKey))}
  if streams:
    nnx.reseed(model, policy='match_shape', **dict.fromkeys(streams, 0))
  return model


def standardized(side: Side) -> Side:
  """`side` as `standard` leaves what it holds: boxed (Variables), and Linen's
  bare params in `{'params': ...}`."""
  form = 'params_collection' if side.form == 'params' and side.framework == 'linen' else side.form
  return dataclasses.replace(side, abstract_state=_stored(side, form, False), form=form, pure=False)


def written(side: Side, converted: Any) -> Any:
  """What to write for `side` (its form, never pure) from a conversion's
  result: Linen variables, or an NNX model."""
  if side.framework == 'linen':
    return converted['params'] if side.form == 'params' else converted
  return nnx.state(converted) if side.form == 'model' else nnx.state(converted, nnx.Param)


def linen_template(side: Side) -> dict:
  """The Linen variables to convert into for `side`: every collection, or
  `{'params': ...}` for a form of the parameters alone."""
  return side.standard if side.form == 'variables' else {'params': side.standard['params']}


def target_form(source: Side, target: Side) -> Side:
  """`target` (a standard weights side) in the form that holds what
  `source` holds: within one framework the same form; across, everything
  for everything and the parameters for the parameters
  (`{'params': ...}` <-> `nnx.state(model, nnx.Param)`)."""
  if source.framework == target.framework:
    form = source.form
  elif source.form in ('variables', 'model'):
    form = FORMS[target.framework][0]
  else:
    form = 'params_collection' if target.framework == 'linen' else 'params'
  return dataclasses.replace(target, abstract_state=_stored(target, form, False), form=form, pure=False)


def find_source(models, info, mesh) -> tuple[str | None, Side]:
  """`(layout, side)` of the one form, of either framework's model and of any
  layout its factory makes, whose tree the weights checkpoint `info` holds.

  Raises:
    CheckpointError: no form holds it (the nearest one's differences are
      listed), or forms of both frameworks do (the checkpoint does not say
      which model saved it).
  """
  matches, nearest = [], []
  for framework in ('linen', 'nnx'):
    for layout in models.layouts(framework):
      for side in forms(models.side(framework, mesh, layout, weights=True)):
        problems = checkpoints.differences(info.leaves, checkpoints.leaves_of(side.abstract_state))
        if not any(problems):
          matches.append((layout, side))
        nearest.append((sum(map(len, problems)), side))
  frameworks = {side.framework for _, side in matches}
  if len(frameworks) > 1:
    found = '; '.join(f'{side.what}: {describe(side)}' for _, side in matches)
    raise CheckpointError(
        f'{info.path}: holds weights only, and its tree is the weights of both models '
        f'({found}), so it does not say which one saved it',
        fix="save it in a form that names its framework: Linen's {'params': ...}, or "
        "NNX's nnx.state(model) (Variables, not a pure dict)",
    )
  if matches:
    return matches[0]
  side = min(nearest, key=lambda n: n[0])[1]
  checkpoints.check_structure(
      dataclasses.replace(info, framework=side.framework),
      checkpoints.leaves_of(side.abstract_state), f'{side.what} ({describe(side)})',
  )
  raise AssertionError('unreachable: check_structure raised')
