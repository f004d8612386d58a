"""What the implementation tests share: the test matrix and expected annotations."""

from __future__ import annotations

import contextlib
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.extend import core as jax_core
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from converters import comparison
from kit_mlp.data import make_batches
from kit_mlp.description import FSDP_RULES, GUIDE_RULES, ModelDescription

MESHES = ((2, 4), (1, 8), (8, 1), (4, 2))
# FSDP rules with 'embed' listed before 'batch': it takes 'data' from activations.
EMBED_FIRST_FSDP_RULES = (FSDP_RULES[2],) + FSDP_RULES[:2] + FSDP_RULES[3:]
# (annotation, rules, layer partition of scanned layers)
STYLES = {
    'device': ('device', GUIDE_RULES, None),
    'logical-guide': ('logical', GUIDE_RULES, 'layer'),
    'logical-fsdp': ('logical', FSDP_RULES, 'layer'),
}
# Every mesh, scanned and looped, with device axes and with logical names; the
# logical rule set alternates between the guide's and the FSDP one by mesh.
_LOGICAL_STYLE = {(2, 4): 'logical-guide', (1, 8): 'logical-fsdp', (8, 1): 'logical-guide', (4, 2): 'logical-fsdp'}
MATRIX = [
    (mesh, use_scan, style)
    for mesh in MESHES
    for use_scan in (False, True)
    for style in ('device', _LOGICAL_STYLE[mesh])
]


# Moments each optimizer keeps per parameter (adam: mu and nu; momentum: a trace).
MOMENTS_PER_PARAM = {'adam': 2, 'adamw': 2, 'sgd_momentum': 1, 'fsdp_sgd': 1}


@functools.cache
def mesh(shape: tuple[int, int] = (2, 4)) -> jax.sharding.Mesh:
  """The tests' mesh: axes `data` and `model` of `shape`, Auto, over the first devices."""
  return jax.make_mesh(shape, ('data', 'model'), axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:math.prod(shape)])


@contextlib.contextmanager
def in_mesh(rules=()):
  """Inside `mesh()`, with Linen's logical axis `rules`."""
  with jax.set_mesh(mesh()), nn.logical_axis_rules(rules or ()):
    yield


def matrix_id(case) -> str:
  mesh, use_scan, style = case
  return f'{mesh[0]}x{mesh[1]}-{"scan" if use_scan else "loop"}-{style}'


def describe(mesh_shape, use_scan, style, **overrides) -> ModelDescription:
  annotation, rules, layer_partition = STYLES[style]
  fields = dict(
      num_layers=2,
      depth=64,
      batch=8,
      use_scan=use_scan,
      layer_partition=layer_partition if use_scan else None,
      annotation=annotation,
      rules=rules,
      mesh_shape=mesh_shape,
  )
  fields.update(overrides)
  return ModelDescription(**fields)


def expected_names(desc: ModelDescription, param_name: str) -> tuple:
  """The annotation the description asks for on the parameter `param_name`."""
  # Written out as in the guides, not read from the description under test.
  if desc.logical:
    names = {'kernel': ('embed', 'hidden'), 'w2': ('hidden', 'embed')}
  else:
    names = {'kernel': (None, 'model'), 'w2': ('model', None)}
  base = names[param_name.lower()]
  return ((desc.layer_partition,) + base) if desc.use_scan else base


def resolve_like_linen(names, rules) -> tuple:
  """Linen's rule priority, written out independently of Flax and the kit.

  The rules are walked in order; a rule gives its mesh axis to its dimension
  if that dimension has none yet and no other dimension holds the axis. So
  the first rule to claim a free axis wins, whatever the dimension order.
  """
  result, decided = [None] * len(names), [False] * len(names)
  for logical_name, mesh_axis in rules:
    if logical_name in names:
      i = names.index(logical_name)
      if not decided[i] and (mesh_axis is None or mesh_axis not in result):
        result[i], decided[i] = mesh_axis, True
  return tuple(result)


def expected_axes(desc: ModelDescription, names) -> tuple:
  return resolve_like_linen(names, desc.rules) if desc.logical else tuple(names)


def expected_sharding(desc: ModelDescription, mesh, names) -> NamedSharding:
  """Resolves `names` with the description's rules, independently of Flax."""
  return NamedSharding(mesh, P(*expected_axes(desc, names)))


def assert_sharded_as(array: jax.Array, sharding: NamedSharding, where: str):
  assert array.sharding.is_equivalent_to(sharding, array.ndim), (
      f'{where}: sharded {array.sharding.spec}, annotation asks for '
      f'{sharding.spec}'
  )


def assert_trees_bit_equal(a, b):
  """The same tree, and leaf for leaf the same dtype, shape and bits, as the
  kit compares them (`converters.comparison.host_bits`: -0.0 is not 0.0)."""
  leaves_a, tree_a = jax.tree.flatten_with_path(a)
  leaves_b, tree_b = jax.tree.flatten_with_path(b)
  assert tree_a == tree_b
  for (path, x), (_, y) in zip(leaves_a, leaves_b):
    # On the host once; `host_bits` of a host array only views its bits.
    x, y = (np.asarray(jax.device_get(comparison.as_key_data(v))) for v in (x, y))
    assert x.dtype == y.dtype and x.shape == y.shape, jax.tree_util.keystr(path)
    assert np.array_equal(comparison.host_bits(x), comparison.host_bits(y)), f'{jax.tree_util.keystr(path)} differs'


def run_case(
    make_trainer, case, optimizer: str, num_steps: int, dtype: str = 'float32'
) -> dict:
  """Creates a state, trains `num_steps` steps one by one and in one call.

  `make_trainer(desc, mesh, optimizer)` builds a Linen or NNX trainer; both
  have `create`, `train_step` and `train_steps`. Keeps everything for the
  tests to inspect.
  """
  desc = describe(*case, dtype=dtype)
  mesh = desc.make_mesh()
  trainer = make_trainer(desc, mesh, optimizer)
  with jax.set_mesh(mesh):
    xs, ys = make_batches(desc, mesh, num_steps, seed=1)
    initial = trainer.create(seed=0)
    stepped, losses = jax.tree.map(jnp.copy, initial), []
    for i in range(num_steps):
      stepped, loss = trainer.train_step(stepped, xs[i], ys[i])
      losses.append(loss)
    scanned, scanned_losses = trainer.train_steps(
        jax.tree.map(jnp.copy, initial), xs, ys
    )
  return dict(
      desc=desc, mesh=mesh, trainer=trainer, xs=xs, ys=ys, initial=initial,
      stepped=stepped, losses=jnp.stack(losses), scanned=scanned,
      scanned_losses=scanned_losses,
  )


def sharding_constraints(closed_jaxpr) -> list[tuple[tuple[int, ...], jax.sharding.Sharding]]:
  """`(shape, sharding)` of every sharding constraint, in order, nested jaxprs
  (scan bodies, jits) included."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'sharding_constraint':
        found.append((eqn.invars[0].aval.shape, eqn.params['sharding']))
      for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
          if isinstance(sub, jax_core.ClosedJaxpr):
            walk(sub.jaxpr)
          elif isinstance(sub, jax_core.Jaxpr):
            walk(sub)

  walk(closed_jaxpr.jaxpr)
  return found


def activation_constraints(closed_jaxpr, shape) -> list[tuple]:
  """The specs of every sharding constraint on a `shape` array, scan bodies included."""
  return [
      tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
      for found, sharding in sharding_constraints(closed_jaxpr)
      if found == shape
  ]


def expected_activation_constraints(desc: ModelDescription) -> list[tuple]:
  """Per layer, the constraint after the first matmul and the one after W2.

  Written out as in the guides: `(data, model)` and `(data, None)` with device
  axes, `('batch', 'hidden')` and `('batch', 'embed')` resolved with the rules
  otherwise. FSDP rules send both 'batch' and 'embed' to 'data': the rule
  listed first takes it and the other dimension stays unsharded.
  """
  if desc.logical:
    per_layer = [
        resolve_like_linen(('batch', 'hidden'), desc.rules),
        resolve_like_linen(('batch', 'embed'), desc.rules),
    ]
  else:
    per_layer = [('data', 'model'), ('data', None)]
  return per_layer * (1 if desc.use_scan else desc.num_layers)


# (Linen module and name, NNX attribute path) of each DotReluDot parameter.
_LAYER_PARAMS = ((('Dense_0', 'kernel'), ('dot1', 'kernel')), (('W2',), ('w2',)))


def parameter_pairs(desc: ModelDescription) -> list[tuple[tuple, tuple]]:
  """`(linen_path, nnx_path)` of every parameter, written out independently of
  `converters.paths` so that the two can check each other."""
  pairs = []
  if desc.use_scan:
    for linen_name, nnx_name in _LAYER_PARAMS:
      pairs.append(
          (('params', 'ScanDotReluDot_0') + linen_name, ('model', 'layers') + nnx_name)
      )
    return pairs
  for i in range(desc.num_layers):
    for linen_name, nnx_name in _LAYER_PARAMS:
      pairs.append(
          (('params', f'DotReluDot_{i}') + linen_name, ('model', 'layers', i) + nnx_name)
      )
  return pairs


_HLO_ARRAY = re.compile(r'\b(?:pred|bf16|[fsu]\d+)\[([\d,]*)\]')


def largest_array_in_program(fn, *args) -> int:
  """Elements of the biggest array in the per-device program XLA compiles for `fn`.

  `fn` runs under `jax.jit`, so jits it calls are inlined and the SPMD
  partitioner sees the whole computation, as one device executes it.
  """
  text = jax.jit(fn).lower(*args).compile().as_text()
  return max(math.prod(int(d) for d in dims.split(',') if d) for dims in _HLO_ARRAY.findall(text))


def largest_shard(tree) -> int:
  """Elements of the biggest shard one device holds of any array in `tree`."""
  return max(math.prod(a.sharding.shard_shape(a.shape)) for a in jax.tree.leaves(tree))


def compile_with_program(jitted, *args):
  """`(compiled, program)`: `jitted` compiled for `args` (call it instead of
  `jitted`, which would compile again) and its per-device program, names aside.

  Source locations, the module's name and every instruction, computation and
  parameter name are dropped or numbered in order of appearance, so two
  functions traced from different code compare equal exactly when XLA runs
  the same instructions on the same shapes, shardings and layouts.
  """
  compiled = jitted.lower(*args).compile()
  lines = []
  for line in compiled.as_text().splitlines():
    if not line.startswith(('%', 'ENTRY', '  %', '  ROOT', '}')):
      continue  # the module header and its tables of file and function names
    line = re.sub(r', (?:metadata|origin)=\{[^}]*\}', '', line)
    line = re.sub(r'[(,] ?[\w.\-]+: ', lambda m: m.group(0)[0], line)  # parameter names
    lines.append(line)
  names = {}
  program = re.sub(r'%[\w.\-]+', lambda m: names.setdefault(m.group(0), f'%{len(names)}'), '\n'.join(lines))
  return compiled, program
