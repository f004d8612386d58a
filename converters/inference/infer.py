"""`infer_paths` and `infer_models`: the path mapping of a model and its port.

Trace both forward passes (`traces`), build their dataflow graphs
(`dataflow`), pair variables by the structure of the whole computation
(`refinement`), prove the pairs by running both models (`witness`), and
write them as rules (`folding`). Nothing pairs by order, name or position
in a list: what structure cannot split is tried by the witness, or refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from converters import abstract_models
from converters.errors import ConversionError, DisagreementError, PathMappingError, UndecidedError, format_offenders
from converters.inference.dataflow import Graph
from converters.inference.folding import REVERSED, fold, fold_paths, merge_layouts, stacked_rules
from converters.inference.parting import parting_words
from converters.inference.refinement import Pairing, pair, remembered
from converters.inference.traces import Call, Trace, trace_linen, trace_nnx, traced
from converters.inference.unrolling import unrolled
from converters.inference.witness import Fused, Witness
from converters.linen_model import LAYOUTS, LinenModel, accepts_layout
from converters.paths import PathMapping, PathRule, as_mapping, format_path
from converters.transforms import Rearrange
from converters.variable_types import DEFAULT_COLLECTIONS, CollectionTable

#: How many assignments of groups the structure cannot split the witness
#: tries (each is one run of both models; they compile once).
MAX_WITNESS_RUNS = 24


def infer_paths(
    linen_module: nn.Module | LinenModel,
    nnx_model: nnx.Module,
    *example_args,
    linen_kwargs: Mapping[str, Any] | None = None,
    nnx_kwargs: Mapping[str, Any] | None = None,
    linen_train_kwargs: Mapping[str, Any] | None = None,
    paths: PathMapping | Iterable[PathRule] | None = None,
    collections: Mapping[str, type] | None = None,
    **example_kwargs,
) -> PathMapping:
  """The Linen <-> NNX path mapping of a model and its port, from what they compute.

  Args:
    linen_module: the Linen module (not initialised: its variables are traced),
      or a `LinenModel` holding it with its example inputs (then give none here).
    nnx_model: its NNX port, real or abstract (`nnx.eval_shape`), in the mode
      to compare (`model.eval()` for dropout).
    *example_args: inputs of one forward pass, arrays or
      `jax.ShapeDtypeStruct`s, the same for both models. The witness runs
      both models on them (abstract ones are drawn: integers in {0, 1}).
    linen_kwargs: keyword arguments for the Linen call only (`train=False`).
    nnx_kwargs: keyword arguments for the NNX call only (`decode=False`).
    linen_train_kwargs: keyword arguments for the Linen call in training
      (`train=True`); without them the Linen call keeps `linen_kwargs` and
      only Flax's own layers are put in training (a flag of the model's own
      stays as given). Where the structure leaves a group whose assignments
      agree at the example, the witness runs them on inputs with their
      selectors drawn anew and backward, which may choose one, and in
      training (Flax's Linen layers in training as `model.train()` puts the
      port's, both drawing the same keys in call order), which may only
      refuse: a group whose swap changes what training computes is refused,
      never decided by the order of its draws.
    **example_kwargs: keyword inputs of the forward pass, the same for both
      models (Flax's examples call `model.apply(v, inputs=tokens)`): arrays
      and `ShapeDtypeStruct`s are inputs as `example_args` are, drawn and
      varied alike; other values (a flag, a count) are constants of both
      traces, which the witness cannot vary: a group they might tell apart
      is refused.
    paths: rules you already know (a fused or reshaped parameter); they take
      precedence, and the rest is inferred.
    collections: `{Linen collection: nnx.Variable subclass}` beyond `params`,
      `batch_stats` and `cache`.

  Call it under the mesh and rules the models are annotated for (`with
  jax.set_mesh(mesh), nn.logical_axis_rules(rules):`) when they need them.

  Returns:
    A `PathMapping` with one rule per variable, layers of a loop folded into
    `{i}` templates; print `mapping.to_python()` to keep it. Every mapping
    returned has been witnessed: both models, run on the example inputs with
    random variables converted through it, agree.

  Raises:
    PathMappingError: listing every variable of either side that has no
      counterpart computed the same way, every group the structure cannot
      split and the witness could not decide, or the outputs that differ.
  """
  if isinstance(linen_module, LinenModel):  # the module with its inputs: those of both calls
    if example_args or example_kwargs:
      raise PathMappingError(
          'infer_paths: the example inputs are given twice, in the LinenModel and after it; '
          'give them in one place'
      )
    example_args, example_kwargs = linen_module.args, linen_module.keyword_inputs
    linen_kwargs = {**linen_module.settings, **(linen_kwargs or {})}
    linen_module = linen_module.module
  call = functools.partial(Call, example_args, example_kwargs)
  return _infer_calls(
      linen_module, nnx_model, call(linen_kwargs or {}), call(nnx_kwargs or {}),
      call(linen_train_kwargs if linen_train_kwargs is not None else linen_kwargs or {}),
      paths=paths, collections=collections, arguments_fix=_INFER_PATHS_ARGUMENTS,
  )


#: How to give a call's arguments, by entry point (a hint names only options it has).
_INFER_PATHS_ARGUMENTS = (
    'give inputs the model takes (positional or keyword: arrays go to both calls), and '
    "keyword arguments of one side only as linen_kwargs= / nnx_kwargs= (Linen's train=False)"
)
_LINEN_MODEL_ARGUMENTS = (
    'give LinenModel(module, *inputs, **keywords) the inputs the model takes: keyword '
    'arguments holding arrays (inputs=tokens) go to both calls, the others (train=False) '
    'to the Linen call alone'
)


def _infer_calls(linen_module, nnx_model, linen_call: Call, nnx_call: Call, linen_training: Call,
                 *, paths, collections, arguments_fix: str) -> PathMapping:
  with remembered():  # each trial below builds the same graphs again
    return _infer_models(linen_module, nnx_model, linen_call, nnx_call, linen_training,
                         paths=paths, collections=collections, arguments_fix=arguments_fix)


def _infer_models(linen_module, nnx_model, linen_call: Call, nnx_call: Call, linen_training: Call,
                  *, paths, collections, arguments_fix: str) -> PathMapping:
  given = as_mapping(paths) if paths is not None else None
  abstract_models.without_tracers(nnx_model)
  fix = arguments_fix + '; an NNX model runs as it is given (model.eval(), and any attribute its call needs set)'
  models = _Traced(
      ('Linen', trace_linen, linen_module, linen_call),
      ('NNX', trace_nnx, nnx_model, nnx_call, CollectionTable(collections)),
      linen_training, fix,
  )
  if given is not None:  # its layers numbered after a loop's (`Dense_{n}`), at these models' length
    given = given.bound('linen', [name[1] for name in models.traces[0].variables if name is not None])
  infer = functools.partial(_infer, models)
  try:
    return infer(given)
  except PathMappingError as refusal:
    inputs = models.call.inputs
    idle = functools.cache(lambda: _idle(models.traces, inputs))
    disagreements: list[tuple[PathMapping, DisagreementError]] = []

    def searched(known):
      """`infer(known)`, the first run the structure pairs whole but the
      models disagree kept: where the port computes otherwise, under the
      simplest rules that make the two structures agree."""
      try:
        return infer(known)
      except DisagreementError as e:
        if not disagreements:
          disagreements.append((known, e))
        raise

    found = _stored_otherwise(searched, given, models.traces, idle)
    if found is None:
      found = _fused_or_split(searched, given, models.traces, inputs, idle)
    if found is not None:
      return found
    if disagreements and not isinstance(refusal, DisagreementError):
      raise _disagreement_under(given, *disagreements[0]) from refusal
    raise


def _disagreement_under(given: PathMapping | None, known: PathMapping, e: DisagreementError) -> DisagreementError:
  """`e`, said of the rules a search tried (those in `known` beyond
  `given`): the refusal of a port that computes otherwise, where its
  structure differs in layouts too (a fused or transposed kernel), names
  the operations where the programs part, not the layouts."""
  tried = [r for r in known.rules if given is None or r not in given.rules]
  rules = ', '.join(r.to_python() for r in tried[:4]) + (', ...' if len(tried) > 4 else '')
  return DisagreementError(
      f'with the layouts that make the two structures agree ({rules}), {e.problem}',
      e.paths,
      fix='either those layouts are not the port\'s (give its rules, '
      "paths=Infer([PathRule('linen/path', 'nnx/path', transform=Rearrange(...))]), and the "
      'rest is inferred), or the port computes otherwise where the programs part: make it '
      'compute as the Linen model does there',
  )


class _Traced:
  """Both models traced once (`traces`), and with their scans unrolled when
  first asked (`unrolled`): every attempt of an inference reads the same.
  In training (`training`) they are traced when first asked."""

  def __init__(self, linen_call: tuple, nnx_call: tuple, linen_training: Call, fix: str):
    self.calls = (linen_call, nnx_call)
    self.fix = fix
    self.traces = tuple(traced(*call, fix=fix) for call in self.calls)
    self.linen_training = linen_training

  @property
  def call(self) -> Call:
    """The Linen side's call (its inputs are both sides')."""
    return self.calls[0][3]

  def fixed(self) -> list[str]:
    """The keywords of either call that no run varies: those not arrays,
    but a mode the training run flips (`train=False` beside `train=True`)."""
    linen, nnx_call = self.calls[0][3], self.calls[1][3]
    modes = {k for k, v in self.linen_training.settings.items() if linen.settings.get(k, v) != v}
    return sorted((set(linen.fixed()) | set(nnx_call.fixed())) - modes)

  @functools.cached_property
  def unrolled(self) -> tuple[Trace, Trace]:
    return tuple(traced(call[0], unrolled, t, fix=self.fix) for call, t in zip(self.calls, self.traces))

  @functools.cached_property
  def training(self) -> tuple[Trace, Trace]:
    (which, trace, module, _), nnx_call = self.calls
    linen = traced(f'{which} (in training)', functools.partial(trace, training=True),
                   module, self.linen_training, fix=self.fix)
    nnx_trace = traced(f'{nnx_call[0]} (in training)', functools.partial(nnx_call[1], training=True),
                       *nnx_call[2:], fix=self.fix)
    return linen, nnx_trace


def _infer(models: _Traced, given) -> PathMapping:
  traces = models.traces
  inputs = models.call.inputs
  first_error = None
  for relaxed in (False, True):
    graphs = (Graph.of(traces[0], relaxed=relaxed), Graph.of(traces[1], relaxed=relaxed))
    result = _paired(traces, graphs, given)
    used = (traces, (frozenset(), frozenset()))
    if not _complete(result) and (graphs[0].loops or graphs[1].loops):
      # A model that scans beside one that loops, or scans of another form
      # (a broadcast weight beside a weight reused): traced again with scans
      # unrolled, each layer of a stacked variable a variable of its own.
      stacked = (graphs[0].scanned, graphs[1].scanned)
      graphs = tuple(Graph.of(u, s, relaxed) for u, s in zip(models.unrolled, stacked))
      again = _paired(models.unrolled, graphs, given)
      if _score(again) >= _score(result):
        result, used = again, (models.unrolled, stacked)

    def robust(used=used, result=result, relaxed=relaxed):
      """Pairs the structure settles with positions relaxed too: a pair
      that rests on a position (of a stack, a selection, a branch) is not."""
      if relaxed:
        return set(result[0].pairs)
      graphs = tuple(Graph.of(t, s, True) for t, s in zip(*used))
      return set(_paired(used[0], graphs, given)[0].pairs)

    try:
      return _proven(traces, inputs, given, result, robust=robust, training=lambda: models.training,
                     fixed=models.fixed())
    except PathMappingError as e:
      # Strict positions first; a port that stacks, concatenates or branches
      # in another order pairs with them relaxed, the witness deciding.
      # The relaxed pass's word wins when it knows more than a mismatch:
      # which variables the example inputs leave undecided.
      if first_error is None or isinstance(e, UndecidedError):
        first_error = e
  raise first_error


#: Most combinations of transforms tried for variables stored otherwise
#: (each one inference, witness included).
MAX_TRANSFORM_TRIALS = 24


def _idle(traces, inputs) -> frozenset:
  """The variables of `traces[0]` (Linen's, or NNX's given the traces the
  other way round) that reach no output on the example inputs."""
  linen = traces[0]
  slots = [(k, None) for k, name in enumerate(linen.variables) if name is not None]
  return Witness(linen, traces[1], inputs[:linen.inputs], slots, nnx_slots=[], fused={}).idle()


def _stored_otherwise(infer, given, traces, idle: Callable[[], frozenset]) -> PathMapping | None:
  """The mapping with a transform for variables a port stores in another
  layout (a kernel kept `(out, in)`, heads `(E, D, H)` for `(E, H, D)`, a
  `DenseGeneral`'s `(E, H, D)` as a `Linear`'s `(E, H*D)`), when one
  assignment of such transforms is proven by the witness, or several are
  (a symmetry of the model: the one that moves the fewest axes is taken),
  and every variable they move reaches an output; None when there is no
  candidate, or the witness is blind to one, or more than
  `MAX_TRANSFORM_TRIALS` would have to be tried.

  Candidates are the pairs the structure makes when a contraction's
  operands are alike in any axis order and variables of one size alike in
  any shape, whose two variables differ in shape or in how a contraction
  uses their axes, each with the rearrangements between their shapes (axes
  moved, then neighbours merged or split); the layers of a loop (one family
  of paths on each side, of one shape) take one rearrangement together, so
  a deep port stored otherwise costs as many trials as a shallow one. Each
  combination runs the whole
  inference with them as given rules, so the rest is paired by structure
  and everything is witnessed: the search proposes, only the witness proves.
  """
  strict = tuple(Graph.of(t) for t in traces)
  loose = tuple(Graph.of(t, any_axis_order=True) for t in traces)
  uses = tuple(_uses(g) for g in strict)
  families: dict[tuple, list] = {}  # layers of one loop stored alike: tried together
  loose_pairs = pair(*loose).pairs
  taken = (frozenset(a for a, _ in loose_pairs), frozenset(b for _, b in loose_pairs))
  for a, b in [*loose_pairs, *_last_of_their_size(strict, traces, given, taken)]:
    if a[1] is not None or b[1] is not None:
      continue
    shapes = tuple(tuple(t.closed.jaxpr.invars[s[0]].aval.shape) for t, s in zip(traces, (a, b)))
    roles = [_contraction_roles(g, u, slot) for g, u, slot in zip(strict, uses, (a, b))]
    if shapes[0] == shapes[1] and roles[0] == roles[1]:
      continue
    paths = tuple(t.variables[s[0]][1] for t, s in zip(traces, (a, b)))
    if given is not None and (given.match_all('linen', paths[0]) or given.match_all('nnx', paths[1])):
      continue  # a variable the user's rules name: theirs wins, nothing is proposed for it
    family = tuple(_family(format_path(p))[0] for p in paths) + shapes
    families.setdefault(family, []).append((a, paths))
  options = [
      [[(*paths, t) for _, paths in members] for t in _rearrangements(*family[2:])]
      for family, members in families.items()
  ]
  options = [c for c in options if c]
  moved = {a for family, members in families.items() for a, _ in members}
  if not any(t is not None for c in options for choice in c for _, _, t in choice):
    return None
  if math.prod(len(c) for c in options) > MAX_TRANSFORM_TRIALS:
    return None
  proven = []
  for combination in itertools.product(*options):
    chosen = [choice for family in combination for choice in family]
    try:
      known = PathMapping([*(given.rules if given is not None else ()), *_folded_rules(chosen, traces)])
      proven.append((_moves(chosen), infer(known)))
    except PathMappingError:
      continue
  # A variable stored otherwise that reaches no output (zero inputs, a
  # branch not taken) is one the witness is blind to: no layout of it is
  # proven, however few were tried. Refused.
  if not proven or moved & idle():
    return None
  if len(proven) == 1:
    return proven[0][1]
  # Several layouts agree, and every variable they store otherwise reaches
  # an output: the model has a symmetry (hidden units permuted alike in
  # every layer that holds them give the same function), and the layout
  # that moves the fewest axes is taken.
  least = min(m for m, _ in proven)
  fewest = [mapping for m, mapping in proven if m == least]
  return fewest[0] if len(fewest) == 1 else None


def _fused_or_split(infer, given, traces, inputs, idle: Callable[[], frozenset]) -> PathMapping | None:
  """The mapping with rules that fuse or split parameters (query, key and
  value kernels as one `Linear`; a `kv` einsum's kernel as two), when one
  combination of them is proven by the witness; None when there is no
  candidate, more than `MAX_TRANSFORM_TRIALS` would have to be tried, or
  none or several are proven.

  Candidates come from what the structure leaves unmatched: a variable of
  one side whose size is that of k >= 2 unmatched variables of the other,
  of one shape, collection and dtype (`_parts_of`), and each way of laying
  the parts along one axis of the whole (`Rearrange('e h d -> e (qkv h d)')`).
  The layers of a loop take one candidate together, as one `{i}` rule. Each
  combination runs the whole inference with them as given rules, so the
  rest is paired by structure (or stored otherwise: `_stored_otherwise`,
  an output projection kept `(N*H, E)` beside the fused input one) and
  everything is witnessed."""
  graphs = tuple(Graph.of(t) for t in traces)
  unmatched = pair(*graphs).unmatched
  first = [_first_use(g) for g in graphs]
  paths = [{slot: format_path(t.variables[slot[0]][1]) for slot in u} for t, u in zip(traces, unmatched)]
  labels = [{slot: g.labels[g.variables[slot]][1:] for slot in u} for g, u in zip(graphs, unmatched)]
  # Each side's unmatched variables of one layer (not stacked) by collection, shape and dtype.
  kinds = [_by_kind([v for v in u if v[1] is None], label.get) for u, label in zip(unmatched, labels)]
  everything = [[format_path(name[1]) for name in t.variables if name is not None] for t in traces]
  options = []
  for whole_side in (0, 1):
    parted_side = 1 - whole_side
    fused_side = ('linen', 'nnx')[whole_side]
    # Each whole of a family of layers with its candidate parts, by the
    # templates they fill: {(whole template, part templates, shapes): {layer: ...}}.
    by_template: dict[str, dict[tuple, dict]] = {}
    for whole in unmatched[whole_side]:
      if whole[1] is not None:
        continue
      template, index = _family(paths[whole_side][whole])
      for parts, distance in _parts_of(whole, whole_side, unmatched=unmatched, kinds=kinds[parted_side],
                                       labels=labels, first=first, paths=paths):
        shapes = (labels[whole_side][whole][1], labels[parted_side][parts[0]][1])
        key = (tuple(_family(paths[parted_side][p])[0] for p in parts), *shapes)
        members = by_template.setdefault(template, {}).setdefault(key, {})
        members[index] = (paths[whole_side][whole], tuple(paths[parted_side][p] for p in parts), distance,
                          frozenset((parted_side, p) for p in parts))
    for template, candidates in by_template.items():
      option = _template_options(template, candidates, fused_side, everything)
      if option:
        # Left whole too (an output projection of a part's size, stored
        # otherwise): most wholes fused first.
        options.append([*option, ((1, 0, 0), (), ())])
  if not options or math.prod(map(len, options)) > MAX_FUSED_COMBINATIONS:
    return None
  runs = [0]

  def budgeted(known):
    """`infer(known)`, each run counted: with the layouts of what is stored
    otherwise tried inside each combination, at most `MAX_FUSED_RUNS`."""
    runs[0] += 1
    if runs[0] > MAX_FUSED_RUNS:
      raise _OutOfRuns()
    return infer(known)

  try:
    # The parts of a whole must reach an output, on their own side, but
    # one: a layout of two parts the runs cannot see (a query and a key
    # over one position) is one no run proves, where one part no run sees
    # (a key's bias, which a softmax cancels) sits where the others leave it.
    blind = functools.cache(lambda: (idle(), _idle(traces[::-1], inputs)))
    return _first_fused(budgeted, given, traces, blind, idle, options)
  except _OutOfRuns:
    return None


def _template_options(template: str, candidates: dict, fused_side: str, everything: list) -> list:
  """`((rank), rules, parted)` for each way of fusing or splitting the wholes
  of the family `template` with their candidate parts (`candidates`: by
  part templates and shapes, each layer's whole and parts), one `{i}` rule
  for every layer when the templates name nothing else."""
  option = []
  for (part_templates, whole_shape, part_shape), members in candidates.items():
    named = [template, *part_templates]
    folded = (None not in members and len(members) > 1 and all(
        {_family(p)[1] for p in side_paths if _family(p)[0] == t} <= set(members)
        for t in named for side_paths in everything
    ))
    cases = [(template, part_templates)] if folded else [(w, p) for w, p, _, _ in members.values()]
    distance = max(m[2] for m in members.values())
    parted = tuple(m[3] for m in members.values())  # each whole's parts
    for t in _parted_rearrangements(tuple(whole_shape), tuple(part_shape), len(part_templates), fused_side):
      rules = tuple(
          PathRule(parts, whole, transform=t) if fused_side == 'nnx' else PathRule(whole, parts, transform=t)
          for whole, parts in cases
      )
      option.append(((0, distance, _part_moves(t)), rules, parted))
  return option


def _by_kind(slots, kind: Callable) -> dict:
  """`{kind(slot): [slots of that kind, in order]}`: variables the structure
  leaves unmatched, told apart by what a search may pair them by."""
  found: dict = {}
  for slot in slots:
    found.setdefault(kind(slot), []).append(slot)
  return found


def _parts_of(whole, whole_side: int, *, unmatched, kinds: dict, labels, first, paths) -> list[tuple[tuple, int]]:
  """`(parts, distance)`: unmatched variables of the other side (`kinds`,
  those of one layer by collection, shape and dtype) that `whole`
  may hold side by side (k >= 2 of one collection, dtype and shape whose
  sizes add up to its size), in the order the computation first uses them,
  with how far they sit from where the whole's parts are expected.

  Where more variables of that kind are left than the whole holds (four
  `(D, D)` projections beside a `kv` einsum's `(2, K, D, H)`), each run of
  k used one after another is a candidate, those at the whole's place in
  its own program first: the parts of the variables its side uses before
  it (a query einsum of one part's size: the key and value come second).
  Within a layer of a loop, only that layer's variables are counted."""
  parted_side = 1 - whole_side
  collection, shape, dtype = labels[whole_side][whole]
  index = _family(paths[whole_side][whole])[1]
  found = []
  for (part_collection, part_shape, part_dtype), members in kinds.items():
    size = max(math.prod(part_shape), 1)
    count = math.prod(shape) // size
    if (part_collection, part_dtype) != (collection, dtype) or count < 2 or count * size != math.prod(shape):
      continue
    in_layer = lambda side, slot: index is None or _family(paths[side][slot])[1] == index
    pool = [m for m in members if in_layer(parted_side, m)]
    if len(pool) < count:
      pool = members
      in_layer = lambda side, slot: True
    pool = sorted(pool, key=lambda m: (first[parted_side].get(m, 0), m))
    if len(pool) > count + 2:
      continue  # too many ways to choose them: the user's rule is needed
    before = [
        v for v in unmatched[whole_side]
        if v[1] is None and in_layer(whole_side, v) and first[whole_side].get(v, 0) < first[whole_side].get(whole, 0)
        and labels[whole_side][v][0] == collection and labels[whole_side][v][2] == dtype
        and math.prod(labels[whole_side][v][1]) % size == 0
    ]
    expected = sum(math.prod(labels[whole_side][v][1]) // size for v in before)
    if len(pool) == count:
      found.append((tuple(pool), 0))
      continue
    found += [(tuple(pool[s:s + count]), abs(s - expected)) for s in range(len(pool) - count + 1)]
  return found


#: Most inference runs the search for fused or split parameters makes, those
#: for what is stored otherwise beside them included.
MAX_FUSED_RUNS = 4 * MAX_TRANSFORM_TRIALS


#: Most combinations of candidates (each whole fused one way, or left) the
#: search orders before it tries the simplest.
MAX_FUSED_COMBINATIONS = 4096


class _OutOfRuns(Exception):
  """The search spent its runs (`MAX_FUSED_RUNS`)."""


def _first_fused(infer, given, traces, blind, idle, options) -> PathMapping | None:
  """The one proven combination of `options` (lists of `(cost, rules,
  parts)` candidates, one list per whole, the whole left as it is among
  them; `parts`, the `(side, slot)`s of each whole), the simplest first;
  None where none or several are, or where two parts of one whole of the
  proven one reach no output (`blind()`: the idle slots of each side)."""
  # Most wholes fused first, then parts nearest their place, then fewest
  # moves (the parts' axes in their own order, the parts outermost): at most
  # `MAX_TRANSFORM_TRIALS` runs, and the first proven wins only where
  # nothing else as simple is proven too.
  def cost(combination):
    return tuple(map(sum, zip(*(c for c, _, _ in combination))))

  proven, trials = [], 0
  for combination in sorted(itertools.product(*options), key=cost):
    if proven and cost(combination) > proven[0][0]:
      break
    rules = [r for _, group, _ in combination for r in group]
    if not rules:
      continue  # nothing fused: what the search began from
    try:
      known = PathMapping([*(given.rules if given is not None else ()), *rules])
    except PathMappingError:
      continue  # candidates naming one variable twice, or what a given rule names
    trials += 1
    if trials > MAX_TRANSFORM_TRIALS:
      return None
    parts = [whole for _, _, wholes in combination for whole in wholes]
    try:
      proven.append((cost(combination), parts, infer(known)))
    except PathMappingError:
      found = _stored_otherwise(infer, known, traces, idle)
      if found is not None:
        proven.append((cost(combination), parts, found))
  if len(proven) != 1:
    return None
  _, parts, mapping = proven[0]
  if any(sum(slot in blind()[side] for side, slot in whole) > 1 for whole in parts):
    return None
  return mapping


def _part_moves(transform: Rearrange) -> int:
  """How far a fusing or splitting `transform` moves axes: pairs of the
  parts' own axes it swaps, and how deep in its group the part axis sits."""
  whole = transform.groups(transform.fused_side)
  parted = [a for g in transform.groups('nnx' if transform.fused_side == 'linen' else 'linen') for a in g]
  order = [a for g in whole for a in g if a != transform.part_axis]
  swaps = sum(1 for i, x in enumerate(order) for y in order[i + 1:] if parted.index(x) > parted.index(y))
  depth = next(g.index(transform.part_axis) for g in whole if transform.part_axis in g)
  return swaps + depth


def _parted_rearrangements(whole: tuple, part: tuple, count: int, fused_side: str) -> list[Rearrange]:
  """`Rearrange`s laying `count` parts of shape `part` along one axis of an
  array of shape `whole` (on `fused_side`), the parts' own axes moved and
  merged as `_rearrangements` does; the part axis named `parts`."""
  stacked = (count, *part)
  candidates = _rearrangements(stacked, whole) if fused_side == 'nnx' else _rearrangements(whole, stacked)
  text = lambda groups: ' '.join(g[0] if len(g) == 1 else f'({" ".join(g)})' for g in groups)
  found = []
  if stacked == tuple(whole):  # the parts outermost, each as it is: `w[i]`
    names = ' '.join(chr(ord('a') + k) for k in range(len(part)))
    found.append(Rearrange(f'{names} -> parts {names}' if fused_side == 'nnx' else f'parts {names} -> {names}'))
  for transform in candidates:
    if transform is None:
      continue
    stacked_groups = transform.linen_groups if fused_side == 'nnx' else transform.nnx_groups
    whole_groups = transform.nnx_groups if fused_side == 'nnx' else transform.linen_groups
    if len(stacked_groups[0]) != 1:
      continue  # the parts' axis is merged with another on their own side
    axis = stacked_groups[0][0]
    whole_text = text(tuple(tuple('parts' if a == axis else a for a in g) for g in whole_groups))
    rest = text(stacked_groups[1:])
    pattern = f'{rest} -> {whole_text}' if fused_side == 'nnx' else f'{whole_text} -> {rest}'
    try:
      found.append(Rearrange(pattern, **{k: v for k, v in transform.sizes if k != axis}))
    except PathMappingError:
      continue
  return found


def _last_of_their_size(graphs, traces, given, taken=(frozenset(), frozenset())) -> list[tuple]:
  """`(linen slot, nnx slot)` of variables the structure, the rules given
  and the pairs `taken` already (each side's slots) leave unmatched, one on
  each side of their collection, dtype and size: a query kernel `(N, D, H)`
  left beside a `Linear`'s `(D, N*H)` once the user's rules name every
  other projection of that size (or a fused key and value kernel's rule,
  and its output projection is paired in any axis order)."""
  unmatched = pair(*graphs).unmatched

  def left(side, slot) -> bool:
    path = traces[side].variables[slot[0]][1]
    return not (slot[1] is not None or slot in taken[side]
                or (given is not None and given.match_all(('linen', 'nnx')[side], path)))

  def kind(graph):
    def of(slot):
      collection, shape, dtype = graph.labels[graph.variables[slot]][1:]
      return collection, dtype, math.prod(shape)
    return of

  kinds = [_by_kind([v for v in unmatched[side] if left(side, v)], kind(graph)) for side, graph in enumerate(graphs)]
  found = []
  for kind, linen_slots in kinds[0].items():
    nnx_slots = kinds[1].get(kind, [])
    if len(linen_slots) != len(nnx_slots):
      continue
    if len(linen_slots) == 1:
      found.append((linen_slots[0], nnx_slots[0]))
      continue
    # One per layer of a loop on each side (`layer_{i}/q` beside
    # `layers/{i}/q_proj`): paired layer by layer.
    by_layer = [
        {_family(format_path(trace.variables[slot[0]][1])): slot for slot in slots}
        for trace, slots in zip(traces, (linen_slots, nnx_slots))
    ]
    templates = [{template for template, _ in layers} for layers in by_layer]
    indices = [[index for _, index in layers] for layers in by_layer]
    if any(None in found_indices for found_indices in indices):
      continue  # not the layers of a loop
    if all(len(t) == 1 for t in templates) and sorted(indices[0]) == sorted(indices[1]):
      linen_of = {index: slot for (_, index), slot in by_layer[0].items()}
      found += [(linen_of[index], slot) for (_, index), slot in by_layer[1].items()]
  return found


def _moves(combination) -> int:
  """How far the transforms of `combination` move axes: pairs of axes
  whose order they swap, summed."""
  total = 0
  for _, _, transform in combination:
    if transform is None:
      continue
    left, right = (re.sub(r'[()]', ' ', side).split() for side in transform.pattern.split('->'))
    order = [left.index(a) for a in right if a in left]
    total += sum(1 for i in range(len(order)) for j in range(i + 1, len(order)) if order[i] > order[j])
  return total


def _folded_rules(choices, traces) -> list[PathRule]:
  """Rules for `(linen path, nnx path, transform)` choices, the layers of a
  loop that share a transform folded into one `{i}` rule where that template
  names no other variable of either model."""
  by_transform: dict[Rearrange | None, list] = {}  # a pattern with its sizes: (E, 4, 2) is not (E, 2, 2)
  for choice in choices:
    by_transform.setdefault(choice[2], []).append(choice)
  out = []
  for group in by_transform.values():
    own = {(f, p) for lp, np_, _ in group for f, p in (('linen', lp), ('nnx', np_))}
    others = [v for v in _variable_paths(traces) if v not in own]
    pairs = dict.fromkeys((lp, np_) for lp, np_, _ in group)
    out += [dataclasses.replace(r, transform=group[0][2]) for r in fold(pairs, others)]
  return out


def _variable_paths(traces) -> list[tuple[str, tuple]]:
  """`(framework, path)` of every variable of both models."""
  return [
      (framework, name[1])
      for framework, trace in zip(('linen', 'nnx'), traces)
      for name in trace.variables if name is not None
  ]


def _uses(graph: Graph) -> dict[int, list]:
  """`{node: [(edge label, target)]}`."""
  uses: dict[int, list] = {}
  for s, e, t in graph.edges:
    uses.setdefault(s, []).append((e, t))
  return uses


def _contraction_roles(graph: Graph, uses: dict, slot) -> list:
  """How contractions use variable `slot` (their edges' operand roles), and
  where it is used transposed, followed into loops' bodies."""
  found, todo, seen = [], [graph.variables.get(slot)], set()
  while todo:
    node = todo.pop()
    if node in seen:
      continue
    seen.add(node)
    for e, t in uses.get(node, ()):
      if e in ('sliced', 'enters'):
        todo.append(t)
      elif isinstance(e, tuple) or e == 'transposed':
        found.append(repr(e))
  return sorted(found)


def _rearrangements(linen: tuple, nnx: tuple) -> list:
  """`Rearrange`s that store an array of shape `linen` as `nnx` by moving
  its axes and then merging neighbours (`(E, H, D)` as `(E, H*D)`) or
  splitting them (the other way), each distinct one once, the identity
  (None) included where the shapes are equal: a contraction written with
  its operands the other way round stores nothing otherwise, and a witness
  that cannot tell the two apart must see two proven, not one."""
  if math.prod(linen) != math.prod(nnx) or not linen or not nnx or max(len(linen), len(nnx)) > 4:
    return []
  found: dict = {}
  for order in itertools.permutations(range(len(linen))):  # moved, then merged
    for groups in _groupings([linen[k] for k in order], nnx):
      names, grouped = _written(len(linen), order, groups)
      _candidate(found, names, grouped, {n: linen[k] for k, n in enumerate(names.split())}, linen)
  for order in itertools.permutations(range(len(nnx))):  # split, then moved
    for groups in _groupings([nnx[k] for k in order], linen):
      if not any(size > 1 for size in groups):
        continue
      names, grouped = _written(len(nnx), order, groups)
      _candidate(found, grouped, names, {n: nnx[k] for k, n in enumerate(names.split())}, linen)
  return list(found.values())


def _written(rank: int, order: tuple, groups: list[int]) -> tuple[str, str]:
  """`('a b c', 'a (c b)')`: a side's axes as named, and moved into `order`
  with neighbours grouped `groups` at a time."""
  names = [chr(ord('a') + k) for k in range(rank)]
  moved, parts, at = [names[k] for k in order], [], 0
  for size in groups:
    part = moved[at:at + size]
    parts.append(part[0] if size == 1 else f'({" ".join(part)})')
    at += size
  return ' '.join(names), ' '.join(parts)


def _groupings(sizes: list[int], target: tuple) -> list[list[int]]:
  """Each way neighbouring `sizes` make the axes of `target` (how many make
  each): one, but where an axis of size 1 may join the group before it or
  the one after (`(2, 1, 8, 4)` as `(2, 8, 4)`: `(a b) c d` or `a (b c) d`)."""
  if not target:
    return [[]] if not sizes else []
  found, product = [], 1
  for count in range(1, len(sizes) + 1):
    product *= sizes[count - 1]
    if product > target[0]:
      break
    if product == target[0]:
      found += [[count, *rest] for rest in _groupings(sizes[count:], target[1:])]
  return found


def _candidate(found: dict, left: str, right: str, sizes: dict, linen: tuple) -> None:
  """Adds `Rearrange(left -> right)` to `found`, keyed by where it sends
  each element (two patterns that move the same elements are one)."""
  if left == right:
    transform = None
  else:
    merged = [g for side in (left, right) for g in re.findall(r'\(([^)]*)\)', side)]
    needed = {a for g in merged for a in g.split()[:-1]}
    transform = Rearrange(f'{left} -> {right}', **{a: sizes[a] for a in sorted(needed)})
  iota = np.arange(math.prod(linen), dtype=np.int32).reshape(linen)
  moved = iota if transform is None else transform.apply([iota], 'linen', 0, xp=np)[0]  # (on the host)
  key = (moved.shape, hashlib.sha1(moved.tobytes()).hexdigest())
  if key not in found:
    found[key] = transform


def _paired(traces, graphs, given):
  anchors = _anchor(traces, graphs, given)
  return pair(*graphs), anchors, graphs


def _complete(result) -> bool:
  """Every variable paired, and every given rule's NNX variable anchored to
  Linen ones (a rule across layouts, `linen_stacked=` beside `{i}`, anchors
  layer by layer only with the scans unrolled)."""
  pairing, anchors = result[0], result[1]
  return (
      not pairing.groups and not any(pairing.unmatched)
      and all(sources for sources, _, _ in anchors.values())
  )


def _score(result) -> tuple:
  pairing = result[0]
  return (-sum(len(u) for u in pairing.unmatched), -sum(len(g[0]) for g in pairing.groups))


def _anchor(traces: tuple[Trace, Trace], graphs: tuple[Graph, Graph], given: PathMapping | None):
  """Variables the given rules name: taken out of the pairing, labelled
  alike on both sides (`('given', rule, layer)`) so they anchor the rest.
  Returns `{nnx slot: (linen slots, rule, part)}` for the witness."""
  if given is None:
    return {}
  found = ({}, {})
  rules = given.resolved_rules  # a counted rule (`Dense_{n}`) at these models' number
  for side, (trace, graph, framework) in enumerate(zip(traces, graphs, ('linen', 'nnx'))):
    for slot, node in list(graph.variables.items()):
      path = trace.variables[slot[0]][1]
      matches = given.match_all(framework, path)
      if not matches:
        continue
      m = matches[0]
      layer = m.index if m.layout == 'loop' else slot[1]
      rule = rules.index(m.rule)
      graph.labels[node] = ('given', rule, layer)
      del graph.variables[slot]
      found[side].setdefault((rule, layer), []).append((m.part, slot, m))
  anchors = {}
  for (rule, layer), members in found[1].items():
    sources = [slot for _, slot, _ in sorted(found[0].get((rule, layer), []), key=lambda x: x[0])]
    for part, slot, m in members:
      anchors[slot] = (tuple(sources), rules[rule], part)
  return anchors


def _proven(traces, inputs: list, given, result: tuple, *, robust, training, fixed) -> PathMapping:
  """The mapping of `result` (`(pairing, anchors, graphs)`), once the witness
  proves it on `inputs`; else the refusal that says why. `training()`: both
  traces in training; `fixed`: the inputs the witness cannot vary."""
  linen_trace, nnx_trace = traces
  pairing, anchors, graphs = result
  if any(pairing.unmatched):
    # What the structure leaves unmatched may be one computation written
    # another way (a norm written by hand beside Flax's): variables alike
    # in collection, shape and dtype are tried every way by the witness.
    regrouped = _unmatched_as_groups(traces, graphs, pairing)
    if regrouped is not None:
      try:
        return _proven(traces, inputs, given, (regrouped, anchors, graphs), robust=robust, training=training,
                       fixed=fixed)
      except PathMappingError:
        pass  # no assignment agrees: the structure's word, where the programs part
    _refuse_unmatched(traces, graphs, pairing)
  copies, fused = _copies_and_fused(traces, pairing, anchors)
  slots = sorted({*copies.values(), *(s for f in fused.values() for s in f.sources)}, key=repr)
  slots += sorted({
      (k, None) for k, name in enumerate(linen_trace.variables)
      if name is not None and not any(s[0] == k for s in slots)
  }, key=repr)
  abstract = [format_path(nnx_trace.own[k]) for k, v in nnx_trace.constants.items() if v is None]
  if abstract:
    raise PathMappingError(
        'the NNX model is abstract and holds state of its own (array attributes, or '
        f'Variables of no Linen collection): {format_offenders(abstract)}; running it '
        'needs their values',
        abstract,
        fix='give the NNX model itself (not from nnx.eval_shape), or a function returning '
        'it: its own Variables are then made under jax.jit, the rest stays abstract',
    )
  witness = Witness(linen_trace, nnx_trace, inputs, slots, nnx_slots=sorted(copies, key=repr), fused=fused,
                    training=training)
  # Which variables reach an output is asked only where it matters (a
  # gradient pass): for groups, and for pairs only a position settles.
  fragile = {(a, b) for b, a in copies.items() if b not in anchors}
  fragile = fragile - robust() if fragile else fragile
  idle = witness.idle() if pairing.groups or fragile else frozenset()
  blind = idle | {
      slot for slot in slots
      if not jnp.issubdtype(linen_trace.closed.jaxpr.invars[slot[0]].aval.dtype, jnp.floating)
  }
  verdict, copies, problem = _decide(witness, copies, pairing.groups, blind, fixed)
  if problem is not None:
    raise _undecided(linen_trace, pairing.groups, problem)
  if not verdict.agree:
    raise _disagreement(traces, pairing, verdict, parting_words(*graphs))
  # A pair whose variable reaches no output is not witnessed: it stands on
  # the structure alone, so only when no position decides it.
  grouped = {a for group, _ in pairing.groups for a in group}  # decided by `_decide`
  unwitnessed = sorted({a for a, _ in fragile if a in idle and a not in grouped}, key=repr)
  if unwitnessed:
    names = [_describe(linen_trace, a) for a in unwitnessed]
    raise UndecidedError(
        f'linen {", ".join(names)}: reaches no output on the example inputs, so running '
        'the models cannot check what the structure pairs it with, and only a position '
        '(in a stack, a selection or a branch) pairs it',
        names,
        fix='give example inputs that use it (arrays: abstract integer inputs are drawn in '
        '{0, 1}), or its rule (paths=[PathRule(...)]); the rest is inferred',
    )
  return _rules(traces, given, copies, fused, _first_use(graphs[0]))


def _unmatched_as_groups(traces, graphs, pairing: Pairing) -> Pairing | None:
  """`pairing` with its unmatched variables as groups the witness decides:
  those of one collection, shape and dtype, as many on each side; None
  where they do not fall so, or trying every assignment would take more
  than `MAX_WITNESS_RUNS` runs."""
  kinds = [_by_kind(pairing.unmatched[side], lambda v, g=graph: g.labels[g.variables[v]][1:])
           for side, graph in enumerate(graphs)]
  if kinds[0].keys() != kinds[1].keys() or any(len(kinds[0][k]) != len(kinds[1][k]) for k in kinds[0]):
    return None
  runs = math.prod(math.factorial(len(members)) for members in kinds[0].values())
  if runs > MAX_WITNESS_RUNS:
    return None
  groups = tuple((tuple(kinds[0][k]), tuple(kinds[1][k])) for k in kinds[0])
  singles = tuple((g[0][0], g[1][0]) for g in groups if len(g[0]) == 1)
  return Pairing(
      pairs=pairing.pairs + singles,
      groups=pairing.groups + tuple(g for g in groups if len(g[0]) > 1),
      unmatched=((), ()),
  )


def _refuse_unmatched(traces, graphs, pairing: Pairing) -> None:
  """Refuses variables with no counterpart used alike, saying what to give."""
  problems = _unmatched(traces, graphs, pairing)
  if problems:
    hints = []
    linen_trace, nnx_trace = traces
    unknown = sorted({
        linen_trace.variables[a[0]][0] for a in pairing.unmatched[0]
        if linen_trace.variables[a[0]][0] not in DEFAULT_COLLECTIONS
    })
    if unknown and nnx_trace.own:
      # Linen keeps in a collection of its own what the port holds as a
      # plain nnx.Variable (a constant of the port's, by default).
      hints.append(
          f'Linen keeps {", ".join(repr(c) for c in unknown)} in a collection the port holds '
          'as plain nnx.Variable (read as constants of its own); if they are one, pass '
          + ', '.join(f'collections={{{c!r}: nnx.Variable}}' for c in unknown)
      )
    if not all(problems.values()):
      hints.append(
          'a variable with no counterpart of its size was dropped or added by the port, '
          'or is fused into one of its own: give the rule of a fused one (paths=Infer(['
          "PathRule(('linen/a', 'linen/b'), 'nnx/ab', transform=Rearrange(...))])); a port "
          'that drops or adds a parameter is not the same model'
      )
    if any(problems.values()):
      hints.append(
          'a variable with candidates is used otherwise by the other model: one stored '
          "transposed, reshaped or split needs its rule (paths=Infer([PathRule('linen/path', "
          "'nnx/path', transform=Rearrange(...))])); otherwise the port computes differently "
          'there or in what feeds it (another pooling, activation or operation before the '
          'variables named)'
      )
    parted = parting_words(*graphs)
    raise PathMappingError(
        'the two models do not compute with the same variables'
        + (f' ({parted})' if parted else '') + ': ' + format_offenders(problems),
        [p.split(' (')[0] for p in problems],
        fix='; '.join(hints) + '. The rest is inferred',
    )


def _copies_and_fused(traces, pairing: Pairing, anchors) -> tuple[dict, dict]:
  """`({nnx slot: linen slot}, {nnx variable: Fused})` of the pairs and the given rules."""
  linen_trace, nnx_trace = traces
  copies = {b: a for a, b in pairing.pairs}
  for group_a, group_b in pairing.groups:
    copies.update(zip(sorted(group_b, key=repr), sorted(group_a, key=repr)))
  fused = {}
  for slot, (sources, rule, part) in anchors.items():
    if rule.transform is None and len(sources) == 1:
      copies[slot] = sources[0]
    elif rule.transform is not None and sources:
      parts = rule.parts('linen') if rule.transform.is_parted('linen') else rule.parts('nnx')
      lead = 1 if (sources[0][1] is None and slot[1] is None and
                   len(linen_trace.closed.jaxpr.invars[sources[0][0]].aval.shape) > len(rule.transform.groups('linen'))) else 0
      fused[slot[0]] = Fused(tuple(sources), rule.transform, part, parts, lead)
    else:
      raise PathMappingError(
          f'nnx {format_path(nnx_trace.variables[slot[0]][1])}: the rule given for it names '
          'no Linen variable of this model; fix its Linen template',
          [format_path(nnx_trace.variables[slot[0]][1])],
      )
  return copies, fused


def _decide(witness: Witness, copies: dict, groups, blind: frozenset, fixed: list[str]) -> tuple:
  """`(verdict, assignment, problem)`: the assignment of the groups under
  which both models agree, or why none can be chosen.

  Every assignment is tried. One that agrees is chosen when it is the only
  one. Several that agree at the example may still differ elsewhere: each
  is run where a swap shows (`Witness.symmetric`: selectors drawn anew, in
  training, backward), and one is chosen when it is the only one that
  agrees there, or the only one bit for bit. Several that agree bit for bit
  everywhere are interchangeable (swapping them is a symmetry of both
  programs) when every member reaches an output (`blind`: those that do
  not, and integers, whose reach no gradient shows) and no input the
  witness cannot vary (`fixed`) could make them differ."""
  if not groups:
    return witness.check(copies), copies, None
  runs = math.prod(math.factorial(len(a)) for a, _ in groups)
  if runs > MAX_WITNESS_RUNS:
    return None, copies, (
        f'{runs} assignments of them would have to be tried (at most {MAX_WITNESS_RUNS})'
    )
  agreeing, last = [], None
  for combination in itertools.product(*(
      [dict(zip(sorted(b, key=repr), order)) for order in itertools.permutations(sorted(a, key=repr))]
      for a, b in groups
  )):
    trial = dict(copies)
    for chosen in combination:
      trial.update(chosen)
    last = witness.check(trial)
    if last.agree:
      agreeing.append((last, trial))
  if not agreeing:
    return last, copies, None
  if len(agreeing) == 1:
    return agreeing[0][0], agreeing[0][1], None
  # Several agree at the example: run each where a swap shows.
  wider = [(*witness.symmetric(t), v, t) for v, t in agreeing]
  surviving = [(c, trained, v, t) for c, trained, v, t in wider if c.agree]
  if not surviving:
    worst = min((c for c, _, _, _ in wider), key=lambda c: c.difference)
    return None, copies, (
        f'{len(agreeing)} of their {runs} assignments agree on the example inputs, and none '
        f'beyond them ({worst.where}: {worst.difference:.3g} of the scale)'
    )
  exact = [w for w in surviving if w[0].exact and w[2].exact]
  if len(surviving) == 1 or len(exact) == 1:
    _, _, v, t = surviving[0] if len(surviving) == 1 else exact[0]
    return v, t, None
  members = {a for group, _ in groups for a in group}
  if len(exact) == len(surviving) and not members & blind and not fixed:
    # Alike in all they compute. Training, which rests on the order of
    # draws, may only refuse: where no assignment agrees there, the modes
    # or draws do not align and it tells nothing.
    trained = [w[1] for w in surviving]
    if all(tr is None or not tr.agree for tr in trained) or all(tr.agree and tr.exact for tr in trained):
      return surviving[0][2], surviving[0][3], None  # interchangeable: any is right
    differing = next(tr for tr in trained if not tr.agree)
    return None, copies, (
        f'{len(surviving)} of their {runs} assignments compute alike on the example inputs, '
        'on inputs with their selectors drawn anew and backward, but not in training '
        f'({differing.where}): one of them is behind dropout or a random draw of its own'
    )
  return None, copies, (
      f'{len(surviving)} of their {runs} assignments agree on the example inputs, on inputs '
      'with their selectors drawn anew and backward'
      + ('' if exact else ', none bit for bit')
      + (', and some reach no output on the example inputs' if members & blind else '')
      + (f'; keyword arguments ({", ".join(fixed)}) are not arrays but constants '
         'of the trace, which the witness cannot vary, and might tell them apart'
         if fixed and len(exact) == len(surviving) else '')
  )


def _undecided(trace: Trace, groups, problem: str) -> UndecidedError:
  shown = '; '.join(', '.join(_describe(trace, a) for a in group) for group, _ in groups)
  return UndecidedError(
      f'linen {shown}: the structure of the two computations cannot tell these apart, and '
      f'running the models cannot decide either: {problem}',
      [_describe(trace, a) for group, _ in groups for a in group],
      fix='give their rules (paths=Infer([PathRule(...)])), or example inputs that use each '
      'of them differently (positional arrays, not shapes); the rest is inferred',
  )


def _describe(trace: Trace, slot) -> str:
  name = trace.variables[slot[0]]
  layer = '' if slot[1] is None else f' layer {slot[1]}'
  return f'{format_path(name[1])}{layer}'


def _unmatched(traces, graphs, pairing: Pairing) -> dict[str, bool]:
  """`{line: whether it has candidates}`, one line per variable with no
  counterpart, layers of one family folded into one line (`blocks/{i}/w
  (layers 0-23)`), with its candidates."""
  found: dict[tuple, list] = {}
  for side, (trace, graph, other) in enumerate(zip(traces, graphs, traces[::-1])):
    this, that = ('linen', 'nnx')[side], ('NNX', 'Linen')[side]
    theirs = pairing.unmatched[1 - side]
    for slot in pairing.unmatched[side]:
      shape = graph.labels[graph.variables[slot]][1:]
      alike = _folded([
          _describe(other, s) for s in theirs
          if _stored_alike(graphs[1 - side].labels[graphs[1 - side].variables[s]][1:], shape)
      ])
      candidates = f'; {that} candidates of its size, used otherwise: {", ".join(alike)}' if alike else ''
      name = _describe(trace, slot)
      text = (f'({shape[0]}, {shape[1]} {shape[2]}, {_first_use_text(graph, graph.variables[slot])}): '
              f'no {that} variable is used this way{candidates}')
      found.setdefault((this, _family(name)[0], text, bool(alike)), []).append(name)
  problems = {}
  for (this, family, text, has_candidates), names in found.items():
    if len(names) == 1:
      problems[f'{this} {names[0]} {text}'] = has_candidates
      continue
    layers = _ranges(sorted(_family(name)[1] for name in names))
    problems[f'{this} {family} (layers {layers}) {text}'] = has_candidates
  return problems


def _stored_alike(a: tuple, b: tuple) -> bool:
  """Whether `(collection, shape, dtype)` `a` and `b` may hold one array,
  stored in another layout."""
  return a[0] == b[0] and a[2] == b[2] and math.prod(a[1]) == math.prod(b[1])


def _folded(names: list[str]) -> list[str]:
  """Names, those of one family of layers written once as its template."""
  families: dict[str, list[str]] = {}
  for name in names:
    families.setdefault(_family(name)[0], []).append(name)
  return [family if len(members) > 1 else members[0] for family, members in families.items()]


def _family(name: str) -> tuple[str, int | None]:
  """`('blocks/{i}/w', 3)` for `blocks/3/w` (the outermost number), `Dense_3/w`
  or `w layer 3`; the name unchanged and None when it holds no number."""
  match = re.search(r' layer (\d+)$', name)
  if match:
    return name[:match.start()] + ' layer {i}', int(match.group(1))
  match = re.search(r'(?<=[_/])(\d+)(?=/|$)', name)  # the outermost: a layer's index
  if match is None:
    return name, None
  return name[:match.start()] + '{i}' + name[match.end():], int(match.group(1))


def _ranges(numbers: list[int]) -> str:
  """`0-3, 7` for [0, 1, 2, 3, 7]."""
  runs: list[list[int]] = []
  for n in numbers:
    if runs and n == runs[-1][1] + 1:
      runs[-1][1] = n
    else:
      runs.append([n, n])
  return ', '.join(str(a) if a == b else f'{a}-{b}' for a, b in runs)


def _first_use_text(graph: Graph, node: int) -> str:
  uses = sorted((t, e) for s, e, t in graph.edges if s == node)
  if not uses:
    return 'never read'
  target, edge = uses[0]
  operand = {'lhs': 0, 'rhs': 1}.get(edge[0], '') if isinstance(edge, tuple) else edge
  operand = '' if operand == 'operand' else f' operand {operand}'
  return f'{graph.labels[target][0]}{operand}'


def _disagreement(traces, pairing: Pairing, verdict, parted: str = '') -> PathMappingError:
  """The refusal of a pairing the witness disproves (`DisagreementError`),
  or of outputs it cannot compare (non-finite)."""
  groups = '; '.join(
      'linen ' + ', '.join(_describe(traces[0], a) for a in ga)
      + ' with nnx ' + ', '.join(_describe(traces[1], b) for b in gb)
      for ga, gb in pairing.groups
  )
  tried = (
      f'; the structure left these groups, and none of their assignments agrees: {groups}'
      if groups else ''
  )
  if verdict.difference != verdict.difference:  # NaN: the drawn values overflow
    return PathMappingError(
        f'running the models on random values gives non-finite outputs ({verdict.where}), '
        'so the witness cannot check the mapping',
        fix='a parameter that must be positive or well conditioned (a log, a Cholesky '
        'factor) cannot be drawn at random, so this port cannot be proven this way: write '
        'its mapping (PathMapping([...])) and check it with assert_port_equivalent on '
        'real values',
    )
  return DisagreementError(
      'the variables pair by the structure of the two computations, but the models '
      f'disagree when run through that pairing ({verdict.where}: largest difference '
      f'{verdict.difference:.3g} of the outputs\' scale){tried}'
      + (f'; {parted}' if parted else ''),
      fix='the port computes differently from the original, or stores a parameter in '
      'another layout (transposed, reshaped, fused): give the rule of each such '
      "parameter (paths=Infer([PathRule('linen/path', 'nnx/path', transform=Rearrange(...))])); "
      'the rest is inferred',
  )


def _first_use(graph: Graph) -> dict:
  """`{slot: index of the first operation that uses it}`: rules are written
  in the order the computation uses their variables."""
  first: dict[int, int] = {}
  for source, _, target in graph.edges:
    if target < first.get(source, len(graph.labels)):
      first[source] = target
  return {slot: first.get(n, len(graph.labels)) for slot, n in graph.variables.items()}


def _rules(traces, given, copies: dict, fused, first_use: dict) -> PathMapping:
  linen_trace, nnx_trace = traces
  rules: list[PathRule] = list(given.rules) if given is not None else []
  slot_pairs = [
      ((linen_trace.variables[a[0]][1], a[1]), (nnx_trace.variables[b[0]][1], b[1]))
      for b, a in copies.items()
      if b[0] not in fused and not (given is not None and given.match_all('nnx', nnx_trace.variables[b[0]][1]))
  ]
  _check_collections(traces, copies)
  layered = [(a, b) for a, b in slot_pairs if a[1] is not None or b[1] is not None]
  layer_rules, plain, problems = stacked_rules(layered)
  if problems:
    hints = []
    if any(REVERSED in p for p in problems):
      hints.append(
          'no rule reverses the order of a stack (a path mapping pairs layer i with layer i): '
          "store the port's layers so that its layer i is the Linen model's layer i, run in the "
          'same direction (a scan with reverse=True on one side only pairs them last to first)'
      )
    if not all(REVERSED in p for p in problems):
      hints.append('give the rules of these layers (PathRule(linen, nnx, linen_stacked, nnx_stacked))')
    raise PathMappingError(
        'the layers do not pair one to one: ' + format_offenders(problems), fix='; '.join(hints),
    )
  ordered = sorted(
      ((b, a) for b, a in copies.items() if a[1] is None and b[1] is None),
      key=lambda p: (first_use.get(p[1], 0), p[1][0]),
  )
  rank = {(linen_trace.variables[a[0]][1], nnx_trace.variables[b[0]][1]): k for k, (b, a) in enumerate(ordered)}
  flat = [(a[0], b[0]) for a, b in slot_pairs if a[1] is None and b[1] is None] + plain
  flat.sort(key=lambda p: rank.get(p, len(rank)))
  # A template never names a path a given (or inferred transform) rule maps.
  claimed = [v for v in _variable_paths(traces) if given is not None and given.match_all(*v)]
  # The port's own constants, which the witness ran at their values: kept from a target.
  own_paths = [p for p in nnx_trace.own.values() if not (given is not None and given.match_all('nnx', p))]
  held = [name[1] for name in nnx_trace.variables if name is not None]
  own = [PathRule.nnx_only(template) for template in fold_paths(own_paths, held)]
  return PathMapping(rules + fold(dict.fromkeys(flat), claimed) + layer_rules + own)


def _check_collections(traces, copies) -> None:
  """One path mapping serves every collection, so a path cannot name two variables."""
  seen: dict[tuple, str] = {}
  for b, a in copies.items():
    collection = traces[0].variables[a[0]][0]
    for key in (('linen', traces[0].variables[a[0]][1]), ('nnx', traces[1].variables[b[0]][1])):
      if key in seen and seen[key] != collection:
        raise PathMappingError(
            f'{key[0]} path {format_path(key[1])} holds variables of two collections '
            f'({seen[key]} and {collection}); one path mapping serves every '
            'collection, so give them distinct paths',
            [format_path(key[1])],
        )
      seen[key] = collection


# -- paths='infer' of the conversions ------------------------------------------------


def infer_models(
    linen_model: LinenModel | Callable[..., LinenModel],
    nnx_model: nnx.Module | Callable[..., nnx.Module],
    *,
    paths: PathMapping | Iterable[PathRule] | None = None,
    collections: Mapping[str, type] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    rules: tuple | None = None,
) -> PathMapping:
  """The mapping `paths='infer'` stands for: `infer_paths` of a port given whole.

  Args:
    linen_model: a `LinenModel(module, *example_inputs)`, or a function
      returning one; its inputs are the NNX model's too.
    nnx_model: the NNX port (real or abstract; never modified: a copy of it
      is traced, in eval mode), or a function returning it (called under
      `nnx.eval_shape`: nothing is allocated).
    paths: rules you already know; they take precedence.
    collections: as in `infer_paths`.
    mesh, rules: the mesh and logical rules the models are annotated for
      (None: those in context).

  When both sides are functions with a `layout` parameter (`'loop'` or
  `'scan'`), both layouts are inferred and merged (`merge_layouts`): the
  mapping every scan <-> loop conversion needs. Otherwise each side maps in
  the layout of its model (`infer_paths`); a function with a `layout`
  parameter beside a model of one layout makes that model's layout.

  Raises:
    PathMappingError: as `infer_paths`, or a side that is not a model.
  """
  contexts = contextlib.ExitStack()
  with contexts:
    if mesh is not None:
      contexts.enter_context(jax.set_mesh(mesh))
    if rules is not None:
      contexts.enter_context(nn.logical_axis_rules(rules))
    infer = functools.partial(
        _infer_layout, linen_model, nnx_model, paths=paths, collections=collections
    )
    if accepts_layout(linen_model) and accepts_layout(nnx_model):
      return merge_layouts(infer('loop'), infer('scan'))
    if not (accepts_layout(linen_model) or accepts_layout(nnx_model)):
      return infer(None)
    found, failures = [], []
    for layout in LAYOUTS:
      try:
        found.append(infer(layout))
      except PathMappingError as e:
        failures.append(e)
    # The layout of the model given whole, if it maps: its rules keep both
    # sides' paths (a model of the other layout maps too, across layouts).
    whole = [
        m for m in found
        if all(r.only is not None or (r.linen is not None and r.nnx is not None) for r in m.rules)
    ]
    if whole or found:
      return (whole or found)[0]
    raise min(failures, key=lambda e: len(e.paths))


def _infer_layout(linen_model, nnx_model, layout, *, paths, collections) -> PathMapping:
  linen = _made(linen_model, layout, 'linen_model')
  if not isinstance(linen, LinenModel):
    raise PathMappingError(
        f'linen_model: got {type(linen).__name__}; give LinenModel(module, '
        '*example_inputs) (converters.LinenModel), or a function returning one: '
        'a Linen module alone has no inputs to trace it with'
    )
  if isinstance(nnx_model, nnx.Module):
    model = nnx.merge(*nnx.split(nnx_model))  # a copy to put in eval mode
  elif callable(nnx_model):
    model = abstract_port(lambda: _made(nnx_model, layout, 'nnx_model'), collections)
  else:
    raise PathMappingError(
        f'nnx_model: got {type(nnx_model).__name__}; give the NNX model (real or '
        'from nnx.eval_shape) or a function returning it'
    )
  if not isinstance(model, nnx.Module):
    raise PathMappingError(
        f'nnx_model: its function returned {type(model).__name__}, not an nnx.Module'
    )
  model.eval()  # the computation without dropout, as Linen's example inputs ask
  return infer_linen_model(linen, model, paths=paths, collections=collections)


def infer_linen_model(
    linen: LinenModel, nnx_model: nnx.Module, *, paths=None, collections=None,
) -> PathMapping:
  """`infer_paths` of a `LinenModel` and its port: its positional inputs and
  keyword inputs (arrays) those of both calls, its other keywords the
  Linen call's settings."""
  call = functools.partial(Call, linen.args, linen.keyword_inputs)
  return _infer_calls(
      linen.module, nnx_model, call(linen.settings), call(), call(linen.settings),
      paths=paths, collections=collections, arguments_fix=_LINEN_MODEL_ARGUMENTS,
  )


def abstract_port(make: Callable[[], Any], collections: Mapping[str, type] | None = None):
  """What `make` returns, created abstractly (`abstract_models.eval_shape`),
  with its own constants (array attributes, bare Variables of no Linen
  collection) made for real under `jax.jit`: the port the witness runs."""
  model = abstract_models.eval_shape(make)
  if isinstance(model, nnx.Module):
    own = CollectionTable(collections).paths_of_none(model) + abstract_models.abstract_attributes(model)
    model = abstract_models.with_made_values(model, make, own)
  return model


def _made(factory, layout: str | None, what: str):
  """`factory(layout=layout)`, or `factory()`, or the model given as it is."""
  if isinstance(factory, (LinenModel, nn.Module, nnx.Module)) or not callable(factory):
    return factory
  try:
    return factory() if layout is None or not accepts_layout(factory) else factory(layout=layout)
  except ConversionError:
    raise
  except Exception as e:  # the user's factory: any error of theirs
    raise PathMappingError(
        f'{what}: calling {getattr(factory, "__qualname__", repr(factory))} failed: '
        f'{type(e).__name__}: {e}'.strip()
    ) from e
