"""The Linen and NNX implementations paired concept by concept, from the source.

Two parts: the kit's MLP (`linen_impl` beside `nnx_impl`) and the model zoo
(`model_zoo.linen` beside `model_zoo.nnx`), for what the MLP does not use
(dropout, BatchNorm, decode caches, remat, logical rules in context, sown
intermediates, `nnx.bridge`). Both
mark matching regions with

    # [side-by-side: CONCEPT]
    ...
    # [/side-by-side]

(a concept may have several regions in a file; they are shown in order).
`collect` reads them, checks that every concept is marked on both sides, and
`render_markdown` / `render_html` write `docs/side_by_side.md` and a
self-contained two-column HTML page (inline CSS, code highlighted by pygments
with inline styles, no scripts, no remote fonts),
each with a table of contents and a Linen -> NNX API table whose rows link to
where the code uses both.

Every statement the page makes about Flax is a `Claim`, backed by the test
named after it in `tests/linen_nnx_cli/test_side_by_side_claims.py`, which
runs the behaviour on the installed Flax: an upgrade that changes it fails
that test, and a claim without its test fails the page's own tests. Nothing
here imports JAX.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import pathlib
import re
import textwrap

import pygments
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The files each part's regions come from, per side.
SOURCES = {
    'kit': {
        'linen': ('linen_impl/model.py', 'linen_impl/train.py', 'linen_impl/checkpoint.py'),
        'nnx': ('nnx_impl/model.py', 'nnx_impl/train.py', 'nnx_impl/sgd.py', 'nnx_impl/checkpoint.py'),
    },
    'zoo': {
        'linen': ('model_zoo/linen/cnn.py', 'model_zoo/linen/resnet.py', 'model_zoo/linen/transformer.py',
                  'model_zoo/linen/mlp.py'),
        'nnx': ('model_zoo/nnx/cnn.py', 'model_zoo/nnx/resnet.py', 'model_zoo/nnx/transformer.py',
                'model_zoo/nnx/mlp.py'),
    },
}
PARTS = {
    'kit': "The kit's MLP (`linen_impl` and `nnx_impl`)",
    'zoo': 'More of a port, from the model zoo (`model_zoo.linen` and `model_zoo.nnx`)',
}
SIDES = ('linen', 'nnx')


@dataclasses.dataclass(frozen=True)
class Claim:
  """One statement of the page about Flax (or JAX) behaviour.

  Attributes:
    name: names its test: `test_<name>` in the claims test module.
    text: the statement, Markdown with backquoted code.
  """

  name: str
  text: str


@dataclasses.dataclass(frozen=True)
class Concept:
  """One section of the page: its marker name (the anchor too), title, part and claims."""

  name: str
  title: str
  part: str
  claims: tuple[Claim, ...]


@dataclasses.dataclass(frozen=True)
class ApiRow:
  """A row of the API table.

  Attributes:
    linen, nnx: the two APIs.
    linen_text, nnx_text: what to search for in the code each side shows, to
      link the first place it is used.
    note: what differs, in a few words.
    backed_by: the name of the concept claim whose test checks `note`.
  """

  linen: str
  nnx: str
  linen_text: str
  nnx_text: str
  note: str
  backed_by: str


_C = Claim
#: The page's sections, in reading order.
CONCEPTS = (
    Concept('annotate-params', 'Annotating parameters', 'kit', (
        _C('linen_init_returns_boxes',
           'Linen wraps the initializer (`nn.with_partitioning(init, names)`): `init` returns '
           '`nn.Partitioned` boxes holding the array and its `names`.'),
        _C('nnx_annotation_is_out_sharding_metadata',
           'NNX keeps the annotation as `out_sharding` metadata on the Variable: '
           '`nnx.with_partitioning(init, names)` or `nnx.with_metadata(init, out_sharding=names)` '
           'on an initializer, or a keyword of `nnx.Param`. The older keywords `sharding` and '
           '`sharding_names` still work, with a `DeprecationWarning`.'),
        _C('linen_boxes_constrain_at_use',
           "With a mesh in context, Linen's boxes constrain a parameter to its sharding each time "
           "`apply` unboxes it; NNX's annotated Variables do not, so XLA may shard a gradient "
           "otherwise. The kit's `ConstrainedParam` constrains at each read, as Linen does."),
    )),
    Concept('logical-names', 'Logical names and rules', 'kit', (
        _C('linen_logical_boxes_carry_rules',
           "Linen's logical boxes are `nn.LogicallyPartitioned` with their `rules` (`None` when "
           'the rules come from `nn.logical_axis_rules` at use).'),
        _C('nnx_sharding_rules_metadata',
           '`nnx.with_partitioning(init, names, sharding_rules=rules)` is the direct counterpart '
           '(the kit writes the same metadata with `nnx.with_metadata`); '
           '`nnx.get_partition_spec` applies the Variable\'s `sharding_rules`.'),
        _C('nnx_merges_rules_with_the_context',
           'NNX merges a Variable\'s `sharding_rules` with the rules in context '
           '(`nn.logical_axis_rules`, which is `nnx.logical_axis_rules`); a logical name the two '
           'map differently raises a `ValueError`.'),
    )),
    Concept('activation-constraints', 'Activation constraints', 'kit', (
        _C('nnx_has_no_logical_constraint',
           'Linen has `nn.with_logical_constraint`; NNX has no logical constraint of its own, '
           'so the kit resolves the names (`desc.resolve`) and calls '
           '`jax.lax.with_sharding_constraint`.'),
        _C('linen_first_rule_to_claim_a_free_axis_wins',
           "Linen's resolver walks the rules in order, and the first rule to claim a mesh axis "
           'still free wins, whatever the order of the dimensions: with the rules '
           "`(('batch', 'data'), ('embed', 'data'))`, `('embed', 'batch')` resolves to "
           "`P(None, 'data')`."),
        _C('nnx_keeps_a_repeated_mesh_axis',
           "NNX maps each name on its own: with the same rules `('batch', 'embed')` is "
           "`P('data', 'data')` in NNX, which no array can have (creating the Variable raises), "
           "and `P('data', None)` in Linen; a name without a rule passes through as a mesh axis "
           "name, and of two rules for one name (Linen's fallbacks) NNX keeps the last."),
    )),
    Concept('scan-vs-loop', 'Scanned vs looped layers', 'kit', (
        _C('both_insert_the_layer_axis_name_first',
           'Linen lifts the module class with `nn.scan(metadata_params={nn.PARTITION_NAME: '
           'name})`; NNX creates the stacked layers with `nnx.split_rngs` + `nnx.vmap` and '
           'runs them with `nnx.scan`, both with `transform_metadata={nnx.PARTITION_NAME: '
           'name}`. Each inserts `name` as the first name of every stacked annotation.'),
        _C('nnx_vmap_without_transform_metadata_keeps_stale_names',
           '`nnx.vmap` without `transform_metadata` leaves the one-layer annotation on the '
           'stacked array (two names on a rank-3 kernel), silently.'),
        _C('nnx_layer_lists_need_nnx_list_or_nnx_data',
           'Loops: Linen names the layers `DotReluDot_0`, `DotReluDot_1`, ...; an NNX Module '
           'holds a list of layers as `nnx.List([...])` or `nnx.data([...])`: a plain list of '
           'modules raises.'),
    )),
    Concept('sharded-creation', 'Sharded creation', 'kit', (
        _C('linen_shards_init_from_the_boxes',
           'Linen traces `init` with `jax.eval_shape`, reads the shardings off the boxes '
           '(`nn.get_sharding`, or `nn.get_partition_spec` + `nn.logical_to_mesh_sharding`) '
           'and jits `init` with `out_shardings`.'),
        _C('nnx_shards_variables_when_created',
           'NNX shards a Variable with `out_sharding` the moment it is created (eager '
           'sharding, on by default in Flax 0.12), inside `nnx.jit` or not: building the model '
           'under `jax.set_mesh` is all it takes, and building it with no mesh in context '
           'raises.'),
        _C('nnx_vmap_does_not_apply_the_layer_axis',
           'Under `nnx.vmap`, eager sharding shards each layer as it is created; the layer axis '
           'that `transform_metadata` then adds to the annotations is not applied to the stacked '
           'arrays, so the kit constrains a stacked model to its annotations once more.'),
        _C('get_abstract_model_is_a_restore_target',
           '`nnx.get_abstract_model(create, mesh)` gives the graphdef and the abstract state, '
           'each leaf a `ShapeDtypeStruct` with its `NamedSharding`: the target of a restore.'),
        _C('make_mesh_axes_are_explicit_by_default',
           "JAX 0.10's `jax.make_mesh` gives Explicit axes unless told otherwise; on them "
           '`jax.lax.with_sharding_constraint` (used by both sides) only asserts the sharding an '
           'array already has, and raises otherwise. The kit\'s meshes have Auto axes '
           '(`axis_types=(AxisType.Auto,) * 2`). `jax.set_mesh` '
           'replaces `with mesh:` on both sides: it is a JAX change, not a Linen -> NNX one.'),
    )),
    Concept('optimizer-state', 'Optimizer state and its sharding', 'kit', (
        _C('linen_optax_state_is_boxed',
           'Linen keeps the optax state in a `TrainState`; its moments are boxed like the '
           'parameters.'),
        _C('nnx_optimizer_copies_param_metadata',
           '`nnx.Optimizer(model, tx, wrt=nnx.Param)` copies each parameter\'s metadata '
           '(`out_sharding` with it) to its moments. It holds no model (since Flax 0.11): a '
           '`TrainState` becomes a model and an `nnx.Optimizer`, and `optimizer.update(model, '
           'grads)` takes the model. The FSDP example\'s SGD copies the metadata by hand.'),
    )),
    Concept('train-step', 'Train step', 'kit', (
        _C('nnx_modules_are_pytrees',
           'NNX Modules and Optimizers are pytrees: `jax.jit`, `jax.value_and_grad` and '
           '`jax.lax.scan` take them as they are, besides `nnx.jit` and `nnx.value_and_grad` '
           '(which differentiates the `nnx.Param`s only). What a JAX transform changes inside '
           '(RNG counts, batch statistics, an optimizer step) comes out only in what the '
           'function returns; NNX transforms write it back to the objects.'),
        _C('kit_step_merges_inside_the_trace',
           'Linen jits a pure function of the `TrainState`; the kit\'s NNX step is a `jax.jit` '
           'over the bare arrays that merges the model and optimizer back inside the trace, '
           'so a call flattens a plain dict and walks no graph.'),
    )),
    Concept('several-steps', 'Several steps in one call', 'kit', (
        _C('nnx_scan_carries_the_model_and_optimizer',
           '`jax.lax.scan` over the `TrainState` in Linen; `nnx.scan` with the model and '
           'optimizer as its carry in NNX: the updates made in place in the body come out of '
           'the scan.'),
    )),
    Concept('apply', 'Inference', 'kit', (
        _C('both_outputs_are_sharded_like_the_batch',
           'Both jit the forward pass with the output sharded like the batch.'),
    )),
    Concept('checkpoint', 'Checkpoint save and restore', 'kit', (
        _C('orbax_restores_into_the_target_shardings',
           'The same Orbax calls: `ocp.StandardCheckpointer` saves a `TrainState` and an '
           '`nnx.State` alike and restores each array into the sharding of the target\'s '
           '`ShapeDtypeStruct`; Linen restores into the boxed abstract `TrainState`, NNX into '
           "`nnx.get_abstract_model`'s state."),
    )),
    Concept('rules-context', 'Logical rules from the context; Auto and Explicit mesh axes', 'zoo', (
        _C('linen_rules_come_from_the_context',
           'Linen code often leaves the rules out of the boxes (`rules=None`) and gives them '
           'with `nn.logical_axis_rules(rules)` around `init` and `apply`.'),
        _C('nnx_context_rules_resolve_at_creation',
           'NNX ports do one of three things: keep the logical names with the rules as '
           '`sharding_rules` metadata; keep the names and create the model inside '
           '`nnx.logical_axis_rules(rules)` too (without the rules the names are taken for mesh '
           'axes and creation fails); or store the names already resolved with '
           '`nn.logical_to_mesh_axes`.'),
        _C('linen_needs_auto_mesh_axes',
           "Linen's boxes are constrained with `jax.lax.with_sharding_constraint`, so Linen needs "
           "Auto mesh axes: on Explicit ones (JAX 0.10's `jax.make_mesh` default) `init` of an "
           'annotated model raises.'),
        _C('nnx_creates_on_explicit_mesh_axes',
           "NNX's eager sharding reshards on Explicit axes, so creation works there too; running "
           'a model on them is another matter: sharding in types asks for explicit output '
           "shardings (the zoo transformer's embedding lookup raises)."),
    )),
    Concept('dropout', 'Dropout, `train()` and `eval()`, RNG streams', 'zoo', (
        _C('linen_dropout_needs_a_dropout_rng',
           'Linen passes `deterministic` at each call and draws dropout masks from the keys '
           "given to `apply(..., rngs={'dropout': key})`: the same key gives the same mask."),
        _C('nnx_train_and_eval_set_every_dropout',
           "NNX's `nnx.Dropout` follows the module's mode: `model.train()` and `model.eval()` "
           'set it on every submodule, and `nnx.view(model, deterministic=...)` gives a view '
           'in the other mode without changing the model. A new NNX model is in training mode '
           "(dropout on), where Linen's `train` argument is often off by default."),
        _C('nnx_dropout_draws_from_its_rngs_stream',
           '`nnx.Dropout` keeps a fork of the `dropout` stream (else `default`) of the '
           '`nnx.Rngs` it was created with; its count is state of the model (`nnx.RngCount`), '
           'so each call gives a new mask, and the same seeds give the same masks.'),
        _C('nnx_layers_are_created_with_their_input_sizes',
           'NNX layers are created with their input sizes (`nnx.Linear(in_features, '
           'out_features, ...)`): NNX has no shape inference.'),
    )),
    Concept('batch-norm', 'BatchNorm', 'zoo', (
        _C('linen_batch_stats_need_mutable',
           "Linen's `nn.BatchNorm(use_running_average=not train)` keeps the running averages in "
           "the `batch_stats` collection; in training `apply` must be given "
           "`mutable=['batch_stats']` and returns the new ones beside the output."),
        _C('nnx_batch_stats_update_in_place',
           "`nnx.BatchNorm` keeps them as `nnx.BatchStat` Variables and updates them in place "
           'in training mode; after `model.eval()` it uses them and changes nothing.'),
    )),
    Concept('batch-stats-step', 'A train step with batch statistics', 'zoo', (
        _C('nnx_value_and_grad_keeps_batch_stat_updates',
           "Linen's `TrainState` carries `batch_stats` beside the parameters; NNX has no "
           '`TrainState`: `nnx.value_and_grad` differentiates the `nnx.Param`s and writes the '
           '`BatchStat` updates of the forward pass back to the model.'),
    )),
    Concept('decode-cache', 'Decode caches', 'zoo', (
        _C('linen_cache_collection_needs_mutable',
           "Linen's decode-mode `init` creates the `cache` collection, and each `apply` must "
           "be given `mutable=['cache']`."),
        _C('nnx_cache_variables_update_in_place',
           'An NNX port adds `nnx.Cache` Variables (`init_cache`) and updates them in place at '
           'each call.'),
    )),
    Concept('remat-scan', 'Scanned blocks with remat', 'zoo', (
        _C('remat_keeps_values_and_gradients',
           '`nn.remat` (of a module class) and `nnx.remat` recompute the activations in the backward pass '
           'instead of keeping them: the values and gradients are those without remat.'),
        _C('linen_scan_stacks_listed_collections',
           "Linen's `nn.scan` stacks the collections listed in `variable_axes` (`params` and "
           '`cache`) and splits the RNG streams listed in `split_rngs`; NNX stacks whatever '
           '`nnx.vmap` created, `nnx.Cache` included.'),
    )),
    Concept('sow', 'Sown intermediates', 'zoo', (
        _C('linen_sow_needs_mutable_intermediates',
           "Linen's `self.sow('intermediates', name, x)` records `x` only when `apply` is given "
           "`mutable=['intermediates']`, which returns a tuple per name (one entry per `sow`); "
           '`init` leaves them out.'),
        _C('nnx_capture_collects_sown_values',
           "NNX's `self.sow(nnx.Intermediate, name, x)` runs under `nnx.capture(model, "
           'nnx.Intermediate)`, which returns the values beside the output and leaves the model '
           'as it was; outside `nnx.capture` it stores them on the module, with a '
           '`DeprecationWarning` in Flax 0.12.'),
    )),
    Concept('bridge', 'Porting one module at a time: `nnx.bridge`', 'zoo', (
        _C('bridge_to_linen_puts_nnx_params_in_the_linen_tree',
           '`nnx.bridge.ToLinen(nnx.Linear, args=...)` runs an NNX module inside a Linen model: '
           'its parameters sit in the Linen tree under the wrapper\'s name (`params/hidden/kernel`) '
           'and `init` / `apply` work as before.'),
        _C('bridge_to_nnx_needs_lazy_init',
           '`nnx.bridge.ToNNX(linen_module, rngs=rngs)` runs a Linen module inside an NNX model. '
           'It has no parameters until `nnx.bridge.lazy_init(model, x)` runs it on an input; then '
           'they are `nnx.Param`s, and a fork of the `Rngs` it was given stays in the model\'s '
           'state (`to_nnx__rngs`, drawn from at every call), which the Linen original never had.'),
    )),
)

_ROW = ApiRow
#: The API table, in the order of the page.
API_MAP = (
    _ROW('nn.with_partitioning', 'nnx.with_partitioning / out_sharding=', 'nn.with_partitioning',
         "'out_sharding'", 'Mesh axis names on an initializer or a Variable.',
         'nnx_annotation_is_out_sharding_metadata'),
    _ROW('nn.with_logical_partitioning', 'nnx.with_partitioning(..., sharding_rules=...)',
         'nn.with_logical_partitioning', 'nnx.with_partitioning(init, names, sharding_rules',
         'Logical names and their rules.', 'nnx_sharding_rules_metadata'),
    _ROW('nn.with_logical_constraint', 'jax.lax.with_sharding_constraint', 'nn.with_logical_constraint',
         'jax.lax.with_sharding_constraint(x', 'NNX has none: resolve the names, then constrain.',
         'nnx_has_no_logical_constraint'),
    _ROW('nn.get_partition_spec', 'nnx.get_partition_spec', 'nn.get_partition_spec', 'nnx.get_partition_spec',
         "NNX applies the Variables' rules.", 'nnx_sharding_rules_metadata'),
    _ROW('nn.get_sharding', 'nnx.get_named_sharding', 'nn.get_sharding', 'nnx.get_named_sharding',
         'Annotations as `NamedSharding`s of a mesh.', 'nnx_sharding_rules_metadata'),
    _ROW('nn.logical_to_mesh_sharding', 'nnx.get_named_sharding', 'nn.logical_to_mesh_sharding',
         'nnx.get_named_sharding', "NNX resolves logical names with the Variables' rules.",
         'nnx_sharding_rules_metadata'),
    _ROW('nn.scan(metadata_params=...)', 'nnx.vmap / nnx.scan(transform_metadata=...)', 'metadata_params=',
         'transform_metadata=', 'The stacked layer axis enters the annotations.',
         'both_insert_the_layer_axis_name_first'),
    _ROW('jax.eval_shape(init)', 'nnx.get_abstract_model', 'jax.eval_shape', 'nnx.get_abstract_model',
         'The abstract state of a creation, with its shardings.', 'get_abstract_model_is_a_restore_target'),
    _ROW('TrainState', '(model, nnx.Optimizer)', 'TrainState.create', 'nnx.Optimizer(',
         'The optimizer holds no model.', 'nnx_optimizer_copies_param_metadata'),
    _ROW('state.apply_gradients(grads=...)', 'optimizer.update(model, grads)', 'apply_gradients',
         'optimizer.update(model, grads)', 'Linen returns a new state; NNX updates in place.',
         'nnx_optimizer_copies_param_metadata'),
    _ROW('jax.value_and_grad', 'jax.value_and_grad or nnx.value_and_grad', 'jax.value_and_grad',
         'nnx.value_and_grad', "JAX's transforms take NNX Modules; NNX's pick the Params.",
         'nnx_modules_are_pytrees'),
    _ROW('Dropout(deterministic=...)', 'model.train() / model.eval()', 'deterministic=not train',
         'self.dropout(x)', 'The mode is state of the model, not an argument.',
         'nnx_train_and_eval_set_every_dropout'),
    _ROW("apply(..., rngs={'dropout': key})", 'nnx.Rngs(params=..., dropout=...)', "rngs={'dropout'",
         'nnx.Rngs(params=', 'RNG streams are state of the model.',
         'nnx_dropout_draws_from_its_rngs_stream'),
    _ROW("apply(..., mutable=['batch_stats'])", 'nnx.BatchStat, updated in place', "mutable=['batch_stats']",
         'nnx.BatchNorm,', 'No collection to thread through.', 'nnx_batch_stats_update_in_place'),
    _ROW("the 'cache' collection", 'nnx.Cache', "self.variable('cache'", 'nnx.Cache(',
         'Decode caches are Variables of the model.', 'nnx_cache_variables_update_in_place'),
    _ROW('nn.remat', 'nnx.remat', 'nn.remat', 'nnx.remat', 'The same rematerialisation.',
         'remat_keeps_values_and_gradients'),
    _ROW("self.sow('intermediates', ...)", 'self.sow(nnx.Intermediate, ...)', "self.sow('intermediates'",
         'self.sow(nnx.Intermediate', 'A Variable type names the collection.', 'nnx_capture_collects_sown_values'),
    _ROW("apply(..., mutable=['intermediates'])", 'nnx.capture(model, nnx.Intermediate)',
         "mutable=['intermediates']", 'nnx.capture(', 'Returned beside the output on both sides.',
         'nnx_capture_collects_sown_values'),
    _ROW('nnx.bridge.ToLinen (NNX inside Linen)', 'nnx.bridge.ToNNX + lazy_init (Linen inside NNX)',
         'bridge.ToLinen(', 'bridge.ToNNX(', 'Either side can hold the other while a port is under way.',
         'bridge_to_nnx_needs_lazy_init'),
)

# Spans only (the page supplies <pre>), styled inline so the page stays one file.
_LEXER = PythonLexer()
_FORMATTER = HtmlFormatter(nowrap=True, noclasses=True, style='default')

_OPEN = re.compile(r'^\s*# \[side-by-side: ([a-z-]+)\]\s*$')
_CLOSE = re.compile(r'^\s*# \[/side-by-side\]\s*$')


class SideBySideError(ValueError):
  """Markers that do not pair up, or a concept marked on one side only."""


@dataclasses.dataclass(frozen=True)
class Region:
  file: str
  line: int  # first line of code, 1-based
  code: str


def claims() -> tuple[Claim, ...]:
  """Every claim of the page, in page order (the API table's notes are backed by these)."""
  return tuple(c for concept in CONCEPTS for c in concept.claims)


def regions(side: str, root: pathlib.Path = ROOT, part: str = 'kit') -> dict[str, list[Region]]:
  """Every marked region of one side of one part, by concept, in file and line order."""
  found: dict[str, list[Region]] = {}
  for rel in SOURCES[part][side]:
    lines = (root / rel).read_text().splitlines()
    open_at, name = None, None
    for i, line in enumerate(lines):
      if m := _OPEN.match(line):
        if open_at is not None:
          raise SideBySideError(f'{rel}:{i + 1}: {m[1]!r} opens inside {name!r}')
        open_at, name = i, m[1]
      elif _CLOSE.match(line):
        if open_at is None:
          raise SideBySideError(f'{rel}:{i + 1}: a region closes that never opened')
        code = textwrap.dedent('\n'.join(lines[open_at + 1:i])).strip('\n')
        found.setdefault(name, []).append(Region(rel, open_at + 2, code))
        open_at = None
    if open_at is not None:
      raise SideBySideError(f'{rel}:{open_at + 1}: {name!r} never closes')
  return found


def collect(root: pathlib.Path = ROOT) -> dict[str, dict[str, list[Region]]]:
  """`{concept: {'linen': [...], 'nnx': [...]}}`; every concept on both sides of its part."""
  problems = []
  out: dict[str, dict[str, list[Region]]] = {}
  for part in SOURCES:
    sides = {side: regions(side, root, part) for side in SIDES}
    known = {c.name for c in CONCEPTS if c.part == part}
    for side, found in sides.items():
      for name in sorted(set(found) - known):
        problems.append(f'{side} marks unknown concept {name!r} in {part}; add it to CONCEPTS')
    for name in sorted(known):
      missing = [side for side in SIDES if name not in sides[side]]
      if missing:
        where = ' or '.join(', '.join(SOURCES[part][side]) for side in missing)
        problems.append(f'concept {name!r} has no marker in {where}')
      else:
        out[name] = {side: sides[side][name] for side in SIDES}
  if problems:
    raise SideBySideError('; '.join(problems))
  return {c.name: out[c.name] for c in CONCEPTS}


def _code_lines(path: pathlib.Path) -> list[tuple[int, str]]:
  """`(line number, text)` of the lines that are code: no docstrings, no comments."""
  source = path.read_text()
  docstrings = set()
  for node in ast.walk(ast.parse(source)):
    body = getattr(node, 'body', None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
        getattr(body[0], 'value', None), ast.Constant) and isinstance(body[0].value.value, str):
      docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
  return [
      (i, line) for i, line in enumerate(source.splitlines(), 1)
      if i not in docstrings and not line.lstrip().startswith('#')
  ]


def api_locations(
    concepts: dict[str, dict[str, list[Region]]], root: pathlib.Path = ROOT
) -> list[tuple[ApiRow, tuple[str, int], tuple[str, int]]]:
  """Each API row with the first place each side uses it in the code the page
  shows (`concepts`, from `collect`; the kit first, then the zoo)."""
  spans: dict[str, list[range]] = {}
  for sides in concepts.values():
    for found in sides.values():
      for r in found:
        spans.setdefault(r.file, []).append(range(r.line, r.line + r.code.count('\n') + 1))
  shown = {side: [] for side in SIDES}  # (file, line, text) of every code line shown
  for part in SOURCES.values():
    for side in SIDES:
      for rel in part[side]:
        shown[side] += [
            (rel, i, line) for i, line in _code_lines(root / rel)
            if any(i in span for span in spans.get(rel, ()))
        ]
  rows = []
  for row in API_MAP:
    places = []
    for side, text in (('linen', row.linen_text), ('nnx', row.nnx_text)):
      place = next(((rel, i) for rel, i, line in shown[side] if text in line), None)
      if place is None:
        raise SideBySideError(f'no {side} code on the page uses {text!r} ({row.linen} -> {row.nnx})')
      places.append(place)
    rows.append((row, places[0], places[1]))
  return rows


def _where(regions_: list[Region]) -> str:
  return ', '.join(f'`{r.file}:{r.line}`' for r in regions_)


_INTRO = (
    'Each section pairs the code of one concept in the Linen original and its NNX port, '
    'taken from the source, under what differs. Each of those notes is checked against the '
    'installed Flax by the test named after it in '
    '`tests/linen_nnx_cli/test_side_by_side_claims.py`.'
)


def render_markdown(root: pathlib.Path = ROOT) -> str:
  """The page of the docs site (MyST Markdown): each concept's Linen and NNX code
  in two columns (sphinx-design's grid), the API table after them."""
  concepts = collect(root)
  out = [
      '---',
      'html_theme.sidebar_secondary.remove: true',
      '---',
      '',
      '% Generated by `linen-nnx side-by-side --markdown docs/side_by_side.md` from the',
      '% markers in linen_impl/, nnx_impl/ and model_zoo/. Do not edit.',
      '',
      '# Linen and NNX, side by side',
      '',
      _INTRO,
      '',
      '```{contents} On this page',
      ':local:',
      ':depth: 2',
      ':backlinks: none',
      '```',
      '',
  ]
  for part, heading in PARTS.items():
    out += [f'## {heading}', '']
    for concept in (c for c in CONCEPTS if c.part == part):
      out += [f'({concept.name})=', f'### {concept.title}', '']
      out += [f'- {claim.text}' for claim in concept.claims] + ['']
      out += ['::::{grid} 2', ':gutter: 2', ':class-container: side-by-side', '']
      for side, label in (('linen', 'Linen'), ('nnx', 'NNX')):
        regions_ = concepts[concept.name][side]
        out += [':::{grid-item}', f'**{label}** ({_where(regions_)})', '', '```python']
        out += ['\n\n'.join(r.code for r in regions_), '```', ':::', '']
      out += ['::::', '']
  out += ['(api-mapping)=', '## API mapping, Linen -> NNX', '',
          '| Linen | NNX | what differs | used in Linen, then NNX |', '| --- | --- | --- | --- |']
  for row, linen_place, nnx_place in api_locations(concepts, root):
    out.append(
        f'| `{row.linen}` | `{row.nnx}` | {row.note} '
        f'| `{linen_place[0]}:{linen_place[1]}` `{nnx_place[0]}:{nnx_place[1]}` |')
  return '\n'.join(out) + '\n'


def highlight(code: str) -> str:
  """Python source as HTML spans with inline styles (pygments), for a `<pre>`."""
  return pygments.highlight(code, _LEXER, _FORMATTER)


_CSS = '''
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:110rem;padding:0 1rem;color:#1f2328}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2.5rem;border-bottom:1px solid #d0d7de}
nav>ol{columns:2}nav>ol>li{break-inside:avoid}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1rem}.pair>div{min-width:0}
@media (max-width:1600px){.pair{grid-template-columns:1fr}}
td code{white-space:normal;overflow-wrap:normal;word-break:normal}
.pair h3{font-size:.95rem;margin:.4rem 0}.where{color:#59636e;font-weight:normal;font-size:.85rem}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.75rem;overflow-x:auto;font:13px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em}
'''


def _inline(text: str) -> str:
  return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(text, quote=False))


def render_html(root: pathlib.Path = ROOT) -> str:
  concepts = collect(root)
  parts = [
      '<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
      '<title>Linen and NNX, side by side</title>', f'<style>{_CSS}</style></head><body>',
      '<h1>Linen and NNX, side by side</h1>', f'<p>{_inline(_INTRO)}</p>', '<nav><ol>',
  ]
  for part, heading in PARTS.items():
    parts.append(f'<li>{_inline(heading)}<ol>')
    parts += [f'<li><a href="#{c.name}">{_inline(c.title)}</a></li>' for c in CONCEPTS if c.part == part]
    parts.append('</ol></li>')
  parts += ['<li><a href="#api-mapping">API mapping, Linen &rarr; NNX</a></li></ol></nav>']
  for part, heading in PARTS.items():
    parts.append(f'<h1 id="part-{part}">{_inline(heading)}</h1>')
    for concept in (c for c in CONCEPTS if c.part == part):
      parts += [f'<section id="{concept.name}"><h2>{_inline(concept.title)}</h2><ul>']
      parts += [f'<li>{_inline(claim.text)}</li>' for claim in concept.claims]
      parts.append('</ul><div class="pair">')
      for side, label in (('linen', 'Linen'), ('nnx', 'NNX')):
        regions_ = concepts[concept.name][side]
        where = ', '.join(f'{r.file}:{r.line}' for r in regions_)
        code = '\n\n'.join(highlight(r.code) for r in regions_)
        parts.append(
            f'<div><h3>{label} <span class="where">{html.escape(where)}</span></h3>'
            f'<pre><code>{code}</code></pre></div>'
        )
      parts.append('</div></section>')
  parts += ['<section id="api-mapping"><h2>API mapping, Linen &rarr; NNX</h2><table>',
            '<tr><th>Linen</th><th>NNX</th><th>what differs</th><th>used in Linen</th><th>used in NNX</th></tr>']
  link = lambda place: f'<a href="../{place[0]}#L{place[1]}">{place[0]}:{place[1]}</a>'
  for row, linen_place, nnx_place in api_locations(concepts, root):
    parts.append(
        f'<tr><td><code>{html.escape(row.linen)}</code></td><td><code>{html.escape(row.nnx)}</code></td>'
        f'<td>{_inline(row.note)}</td><td>{link(linen_place)}</td><td>{link(nnx_place)}</td></tr>'
    )
  parts += ['</table></section>', '</body></html>']
  return '\n'.join(parts) + '\n'


@dataclasses.dataclass(frozen=True)
class ClassPair:
  """One Linen class of a generated port and the NNX class written from it
  (`stub`: written as a stub that raises, with why)."""

  name: str
  linen: Region
  nnx: Region
  stub: str | None = None


def render_port_html(title: str, pairs: list[ClassPair], checks: list[tuple[str, str, str]],
                     failure: str | None = None) -> str:
  """The page of one `linen-nnx port` run, in the style of the kit's own:
  what was checked, then each Linen class beside the NNX class written
  from it, innermost first."""
  parts = [
      '<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
      f'<title>{html.escape(title)}</title>', f'<style>{_CSS}</style></head><body>',
      f'<h1>{html.escape(title)}</h1>',
      '<p>Each section pairs a Linen class the model uses with the NNX class <code>linen-nnx port</code> '
      'wrote from it, taken from both files; the checks the port was handed over with come first.</p>',
      '<table><tr><th>check</th><th>outcome</th><th></th></tr>',
  ]
  parts += [
      f'<tr><td>{_inline(check)}</td><td>{_inline(outcome)}</td><td>{_inline(figure)}</td></tr>'
      for check, outcome, figure in checks
  ]
  parts.append('</table>')
  if failure:
    parts.append(f'<p><strong>Not proven:</strong> {_inline(failure)}</p>')
  parts += ['<nav><ol>'] + [
      f'<li><a href="#class-{p.name}">{html.escape(p.name)}</a>{" (stub)" if p.stub else ""}</li>' for p in pairs
  ] + ['</ol></nav>']
  for pair in pairs:
    parts.append(f'<section id="class-{html.escape(pair.name)}"><h2><code>{html.escape(pair.name)}</code></h2>')
    if pair.stub:
      parts.append(f'<p><strong>Stub, to port by hand:</strong> {_inline(pair.stub)}</p>')
    parts.append('<div class="pair">')
    for label, region in (('Linen', pair.linen), ('NNX', pair.nnx)):
      parts.append(
          f'<div><h3>{label} <span class="where">{html.escape(f"{region.file}:{region.line}")}</span></h3>'
          f'<pre><code>{highlight(region.code)}</code></pre></div>'
      )
    parts.append('</div></section>')
  parts.append('</body></html>')
  return '\n'.join(parts) + '\n'
