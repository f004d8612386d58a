"""Benchmark: converting ~1 GB checkpoints against a plain Orbax restore-and-save.

Two Linen `TrainState`s with adam, each about 1 GiB of float32: the kit's MLP
(40 layers, depth 1024: 960 MiB), saved with `linen_impl.checkpoint`, and the
model zoo's transformer LM (4 blocks of width 1024, 16 heads, MLP 4096, a
32k vocabulary: ~1 GiB), a user's model given to the tool as users give it
(`--linen-model`, `--nnx-model`, path mapping, logical rules). Then, in fresh
processes run in turn, each measurement once per repeat:

- baseline: the Linen side restores the checkpoint into its shardings and
  saves it again (Orbax `StandardCheckpointer`, as `linen_impl.checkpoint`);
- baseline_readback: the same, then the read-back a conversion must do
  (`converters.checkpoint.verify.verify`): the floor of any verified conversion,
  shown for reference (the goals are against the plain baseline);
- convert: `convert_checkpoint(SRC, DST, 'nnx')` (read, convert, write,
  read back and compare bit for bit, rename into place);
- convert scan: the same, to the stacked layout (a relayout on device).

Each process reports its wall time and its peak resident memory above the
resident memory it had once JAX and the kit were imported and the devices
were up (the interpreter's baseline). Goals: convert / baseline time <= 1.2; peak above
baseline <= 1.5x the checkpoint size. Prints a table per model and writes JSON.

    python benchmarks/checkpoint.py [--models mlp transformer] [--layers 40] [--depth 1024]
                                    [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# Every array fully sharded (no replica), so the arrays of a restored state
# take the checkpoint's size in this process's memory once.
MESH = (1, 8)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup_jax():
  sys.path.insert(0, ROOT)
  from linen_nnx_cli.devices import simulate_cpu_devices

  simulate_cpu_devices(8)
  import jax

  jax.devices()
  return jax


def _rss_bytes() -> int:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _peak_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# The zoo transformer of about 1 GiB with adam (params x 3, float32).
TRANSFORMER = dict(
    vocab_size=32_000, width=1024, num_heads=16, mlp_dim=4096, num_layers=4, max_len=1024,
)


def _transformer_config(layout: str):
  from model_zoo.configs import TransformerConfig

  layers = int(os.environ.get('LINEN_NNX_BENCH_LAYERS', TRANSFORMER['num_layers']))
  return TransformerConfig(**{**TRANSFORMER, 'num_layers': layers}, scan_layers=layout == 'scan')


def linen_transformer(layout: str = 'loop'):
  """The user's Linen model, as `--linen-model benchmarks.checkpoint:linen_transformer`."""
  import jax.numpy as jnp
  from jax import ShapeDtypeStruct

  from converters import LinenModel
  from model_zoo.linen.transformer import TransformerLM

  return LinenModel(TransformerLM(_transformer_config(layout)), ShapeDtypeStruct((8, 16), jnp.int32))


def nnx_transformer(layout: str = 'loop'):
  from flax import nnx

  from model_zoo.nnx.transformer import TransformerLM

  return TransformerLM(_transformer_config(layout), idiom='rules_metadata', rngs=nnx.Rngs(0))


def transformer_models() -> dict:
  """The keyword arguments that describe the transformer to the checkpoint tool."""
  import optax

  from model_zoo import paths
  from model_zoo.configs import RULES
  from tests.converters.checkpoint.zoo_models import mapping

  return dict(
      linen_model=linen_transformer, nnx_model=nnx_transformer,
      paths=mapping(paths.TRANSFORMER), rules=RULES, optimizer=lambda: optax.adam(1e-3),
      mesh_shape=MESH,
  )


def make_transformer_checkpoint(path: str) -> int:
  """A new transformer `TrainState`, created in its shards, saved with Orbax."""
  jax = _setup_jax()
  import orbax.checkpoint as ocp
  from flax import linen as nn

  from converters.checkpoint.models import UserModels

  models = transformer_models()
  user = UserModels(
      models['linen_model'], models['nnx_model'], models['paths'], models['rules'],
      models['optimizer'], MESH,
  )
  mesh = user.make_mesh()
  side = user.side('linen', mesh)
  model = linen_transformer()
  tx = models['optimizer']()

  def create(key):
    from flax.training.train_state import TrainState

    variables = model.module.init(key, jax.numpy.zeros(model.args[0].shape, model.args[0].dtype))
    return TrainState.create(apply_fn=model.module.apply, params=variables['params'], tx=tx)

  with jax.set_mesh(mesh), nn.logical_axis_rules(models['rules']):
    # Created in its shards, as its annotations place it (the tool's own view).
    shardings = jax.tree.unflatten(
        jax.tree.structure(jax.eval_shape(create, jax.random.key(0))),
        [a.sharding for a in jax.tree.leaves(side.abstract_state)],
    )
    state = jax.jit(create, out_shardings=shardings)(jax.random.key(0))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, state)
  return sum(x.nbytes for x in jax.tree.leaves(state))


def make_checkpoint(path: str, layers: int, depth: int) -> int:
  jax = _setup_jax()
  from kit_mlp.description import ModelDescription
  from kit_mlp.optimizers import make_tx
  from linen_impl import checkpoint, train

  desc = ModelDescription(num_layers=layers, depth=depth, batch=8, mesh_shape=MESH)
  mesh = desc.make_mesh()
  trainer = train.make_trainer(desc, mesh, make_tx('adam'))
  with jax.set_mesh(mesh):
    state = trainer.create(seed=0)
  checkpoint.save(path, state)
  return sum(x.nbytes for x in jax.tree.leaves(state))


def measure(model: str, kind: str, src: str, dst: str, budget: int) -> dict:
  """One measurement in this (fresh) process."""
  if kind == 'cp':  # the physical floor: copying the files, nothing decoded
    start = time.perf_counter()
    subprocess.run(['cp', '-r', src, dst], check=True)
    return {'seconds': time.perf_counter() - start, 'peak_above_baseline': 0}
  jax = _setup_jax()
  # Everything either kind uses is imported before the interpreter's baseline
  # is taken: loaded libraries are not memory the work uses.
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint import kit
  from converters.checkpoint.convert import convert_checkpoint
  from converters.checkpoint.models import UserModels
  from flax import linen as nn
  import orbax.checkpoint as ocp

  models = transformer_models() if model == 'transformer' else {'mesh_shape': MESH}
  baseline_rss = _rss_bytes()
  start = time.perf_counter()
  if kind == 'baseline':
    info = checkpoints.inspect(src)
    if model == 'transformer':
      user = UserModels(
          models['linen_model'], models['nnx_model'], models['paths'], models['rules'],
          models['optimizer'], MESH,
      )
      mesh = user.make_mesh()
      target = user.side('linen', mesh).abstract_state
    else:
      plan = kit.KitModels(MESH).plan(info, 'linen')
      mesh, target = plan.mesh, plan.source.abstract_state
    with jax.set_mesh(mesh), nn.logical_axis_rules(models.get('rules') or ()):
      with ocp.StandardCheckpointer() as checkpointer:  # the ordinary restore and save
        state = checkpointer.restore(src, target)
        checkpointer.save(dst, state)
  else:
    layout = 'scan' if kind.startswith('relayout') else None
    convert_checkpoint(
        src, dst, 'nnx', layout=layout, memory_budget=budget,
        in_memory=kind.endswith('in_memory'), **models,
    )
  seconds = time.perf_counter() - start
  return {'seconds': seconds, 'peak_above_baseline': _peak_bytes() - baseline_rss}


def _run(command: list[str], env=None) -> str:
  return subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout


KINDS = ('baseline', 'cp', 'same_layout', 'relayout')


def run_model(model: str, args, work: str, layers: int) -> dict:
  """Every measurement of `model`, `args.repeats` times in fresh processes, in turn."""
  kinds = KINDS + tuple(f'{k}_in_memory' for k in ('same_layout', 'relayout') if args.in_memory)
  env = {**os.environ, 'LINEN_NNX_BENCH_LAYERS': str(layers)}
  src = os.path.join(work, f'{model}-src')
  if model == 'transformer':
    make = 'make_transformer_checkpoint(%r)' % src
  else:
    make = 'make_checkpoint(%r, %d, %d)' % (src, layers, args.depth)
  size = int(_run([sys.executable, '-c', (
      'import sys; sys.path.insert(0, %r); from benchmarks.checkpoint import '
      'make_checkpoint, make_transformer_checkpoint; print(%s)'
  ) % (ROOT, make)], env).split()[-1])
  runs = {k: [] for k in kinds}
  for _ in range(args.repeats):
    for kind in kinds:
      dst = os.path.join(work, f'{model}-{kind}')
      out = _run([
          sys.executable, os.path.abspath(__file__), '--measure', model, kind, src, dst,
          str(args.memory_budget),
      ], env)
      runs[kind].append(json.loads(out.strip().splitlines()[-1]))
      shutil.rmtree(dst)
  shutil.rmtree(src)

  described = (
      f'{layers} layers, depth {args.depth}' if model == 'mlp'
      else 'zoo transformer, {num_layers} blocks, width {width}, vocab {vocab_size}'.format(
          **{**TRANSFORMER, 'num_layers': layers})
  )
  results = {'model': described, 'checkpoint_bytes': size, 'runs': runs}
  median = {k: statistics.median(r['seconds'] for r in runs[k]) for k in kinds}
  print(f'\n{model}: {described}, adam: {size / 2**20:.0f} MiB, memory budget {args.memory_budget / 2**20:.0f} MiB')
  print(f'{"measurement":<24} {"s (median)":>11} {"vs Orbax":>9} {"vs cp":>7} {"peak above interpreter":>23}')
  for kind in kinds:
    peak = max(r['peak_above_baseline'] for r in runs[kind])
    results[kind] = {
        'seconds': median[kind],
        'time_ratio_vs_orbax': median[kind] / median['baseline'],
        'time_ratio_vs_cp': median[kind] / median['cp'],
        'peak_rss_above_interpreter_mib': peak / 2**20,
        'memory_budget_mib': args.memory_budget / 2**20,
    }
    print(
        f'{kind:<24} {median[kind]:>11.2f} {median[kind] / median["baseline"]:>8.2f}x '
        f'{median[kind] / median["cp"]:>6.2f}x {peak / 2**20:>19.0f} MiB'
    )
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', nargs='+', choices=('mlp', 'transformer'), default=['transformer', 'mlp'])
  parser.add_argument(
      '--layers', type=int, nargs='+', default=None,
      help='checkpoint sizes, as layers (default: transformer 4 = 1 GiB; MLP 40 = 960 MiB)',
  )
  parser.add_argument('--depth', type=int, default=1024)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--memory-budget', type=int, default=2**30)
  parser.add_argument('--in-memory', action='store_true', help='also measure the in-memory path')
  parser.add_argument('--json', default='benchmarks/results/checkpoint.json')
  parser.add_argument('--measure', nargs=5, metavar=('MODEL', 'KIND', 'SRC', 'DST', 'BUDGET'), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.measure:
    model, kind, src, dst, budget = args.measure
    print(json.dumps(measure(model, kind, src, dst, int(budget))))
    return

  work = tempfile.mkdtemp(prefix='linen-nnx-bench-')
  results = {}
  try:
    for model in args.models:
      sizes = args.layers or ([TRANSFORMER['num_layers']] if model == 'transformer' else [40])
      for layers in sizes:
        results[f'{model}-{layers}'] = run_model(model, args, work, layers)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'\nwrote {args.json}')


if __name__ == '__main__':
  main()
