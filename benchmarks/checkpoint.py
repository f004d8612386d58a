"""Benchmark: streaming checkpoint conversion against a plain Orbax restore + save and `cp -r`.

The model zoo's transformer LM with adam (4 blocks of width 1024, 16 heads,
MLP 4096, a 32k vocabulary: about 1 GiB; `--layers 4 52` adds about 8 GiB),
a Linen `TrainState` saved with Orbax and given to the tool as a user gives
their models (factories, path mapping, logical rules, optimizer); the same
transformer's weights only (`transformer-weights`: the variables `init`
returns, saved with Orbax, about a third of the size); and the kit's MLP
(40 layers, depth 1024: 960 MiB). Each measurement runs in a fresh
process, in turn, once per repeat:

- baseline: what a user would otherwise run: the Linen side restores the
  checkpoint into its shardings and saves it again (Orbax
  `StandardCheckpointer`);
- cp: `cp -r` of the source directory, the physical floor on this disk;
- same_layout: `convert_checkpoint(SRC, DST, 'nnx')`, streamed (moved
  chunks, full verification, rename into place);
- relayout: the same to the stacked layout (loop -> scan);
- same_layout_2_processes: same_layout by two processes of one JAX job
  (4 devices each), each streaming its share; its wall time is the slower
  process's;
- with `--in-memory`, both conversions on the in-memory path too.

Conversions run as the `linen-nnx` command runs them: glibc set to recycle
large buffers at start-up (`converters.allocator.recycle_large_buffers`);
the baseline with glibc's defaults, as a plain script runs.

Each process reports its wall time and its peak resident memory above the
memory it had once JAX and the libraries were imported and the devices were
up. Goals: same layout <= 0.6x the baseline's time, relayout <= 1.0x; peak
<= the memory budget + 256 MiB at every size, the peaks of the sizes within
20% of each other; two processes faster than one.

`--memory-limit SIZE` also runs the baseline and the same-layout conversion
of each size in a memory cgroup of SIZE (the kernel kills a process that
goes over it): a conversion of a checkpoint larger than the limit succeeds
where a plain Orbax restore is killed. It needs the right to create a memory
cgroup (root, or a delegated cgroup v2), and says so when it has not.

A measurement that fails (the baseline of a checkpoint the machine's memory
cannot hold) is recorded with its error and leaves its ratios empty. Prints
a table per model and size and writes JSON: per size and kind,
`time_ratio_vs_orbax`, `time_ratio_vs_cp`, `peak_rss_above_interpreter_mib`,
`memory_budget_mib`.

    python benchmarks/checkpoint.py [--models transformer mlp] [--layers 4 52]
        [--repeats 3] [--memory-budget BYTES] [--memory-limit 4GiB] [--in-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

# Every array fully sharded (no replica), so the arrays of a restored state
# take the checkpoint's size in this process's memory once.
MESH = (1, 8)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup_jax(recycle: bool = False, process: tuple[int, int] | None = None):
  """JAX on 8 simulated CPU devices (4 for each of two processes `(id, port)`);
  `recycle`: glibc set up as the `linen-nnx` command sets it at start-up."""
  sys.path.insert(0, ROOT)
  from linen_nnx_cli.devices import simulate_cpu_devices

  simulate_cpu_devices(8 if process is None else 4)
  if recycle:
    from converters.allocator import recycle_large_buffers

    recycle_large_buffers()
  import jax

  if process is not None:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(f'localhost:{process[1]}', num_processes=2, process_id=process[0])
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


def make_transformer_checkpoint(path: str, weights: bool = False) -> int:
  """A transformer `TrainState` as training leaves it (with `weights`, its
  variables alone), saved as Orbax saves it.

  Every float array is random (trained parameters and adam moments are; a
  fresh state's zero moments would compress to nothing), every counter 1000.
  It is written chunk by chunk, each shard a chunk with Orbax's codec and
  Orbax's metadata files (`converters.checkpoint.orbax_files`, whose files
  the tests compare with Orbax's), so a checkpoint larger than this machine's
  memory is made in little of it; the baseline's plain Orbax restore reads it.
  """
  jax = _setup_jax()
  import numpy as np
  import orbax.checkpoint as ocp

  from converters.checkpoint.inspect import string_path
  from converters.checkpoint.models import UserModels
  from converters.checkpoint.orbax_files import (
      CheckpointWriter, StoredArray, chunk_grid, chunk_region, run_coroutine,
  )

  models = transformer_models()
  user = UserModels(
      models['linen_model'], models['nnx_model'], models['paths'], models['rules'],
      models['optimizer'], MESH,
  )
  abstract = user.side('linen', user.make_mesh(), weights=weights).abstract_state
  names = jax.tree.leaves(ocp.tree.get_param_names(abstract))
  leaves = jax.tree_util.tree_flatten_with_path(abstract)[0]
  rng = np.random.default_rng(0)
  os.makedirs(path)
  writer = CheckpointWriter(path)
  arrays = {}

  async def write():
    await writer.open()
    for (keypath, leaf), name in zip(leaves, names):
      dtype = np.dtype(leaf.dtype)
      chunks = tuple(leaf.sharding.shard_shape(leaf.shape))
      array = StoredArray(
          name, tuple(leaf.shape), dtype, chunks,
          CheckpointWriter.zarr_metadata(leaf.shape, dtype, chunks),
      )
      await writer.create(array)
      for index in np.ndindex(*chunk_grid(leaf.shape, chunks)):
        region = chunk_region(leaf.shape, chunks, index)
        shape = tuple(b - a for a, b in region)
        block = (
            (rng.standard_normal(shape, np.float32) * 0.02).astype(dtype)
            if np.issubdtype(dtype, np.floating) else np.full(shape, 1000, dtype)
        )
        await (await writer.write(array, region, block))
      arrays[string_path(keypath)] = array
    await writer.close()

  run_coroutine(write())
  writer.merge()
  writer.write_metadata(abstract, arrays, {})
  return sum(a.nbytes for a in arrays.values())


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


def measure(model: str, kind: str, src: str, dst: str, budget: int, process=None) -> dict:
  """One measurement in this (fresh) process (`process`: `(id, port)` of two)."""
  if kind == 'cp':  # the physical floor: copying the files, nothing decoded
    start = time.perf_counter()
    subprocess.run(['cp', '-r', src, dst], check=True)
    return {'seconds': time.perf_counter() - start, 'peak_above_baseline': 0}
  jax = _setup_jax(recycle=kind != 'baseline', process=process)
  # Everything either kind uses is imported before the interpreter's baseline
  # is taken: loaded libraries are not memory the work uses.
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint.convert import CheckpointOptions, convert_checkpoint
  from linen_nnx_cli.kit_models import models_for
  from flax import linen as nn
  import orbax.checkpoint as ocp

  transformer = model.startswith('transformer')
  models = models_for(**(transformer_models() if transformer else {'mesh_shape': MESH}))
  baseline_rss = _rss_bytes()
  start = time.perf_counter()
  if kind == 'baseline':
    info = checkpoints.inspect(src)
    if transformer:
      mesh = models.make_mesh()
      target = models.side('linen', mesh, weights=model == 'transformer-weights').abstract_state
    else:
      plan = models.plan(info, 'linen')
      mesh, target = plan.mesh, plan.source.abstract_state
    with jax.set_mesh(mesh), nn.logical_axis_rules(models.rules if transformer else ()):
      with ocp.StandardCheckpointer() as checkpointer:  # the ordinary restore and save
        state = checkpointer.restore(src, target)
        checkpointer.save(dst, state)
  else:
    layout = 'scan' if kind.startswith('relayout') else None
    in_memory = kind.endswith('in_memory')
    convert_checkpoint(
        src, dst, 'nnx', models=models, layout=layout,
        options=CheckpointOptions(in_memory=in_memory, memory_budget=None if in_memory else budget),
    )
  seconds = time.perf_counter() - start
  return {'seconds': seconds, 'peak_above_baseline': _peak_bytes() - baseline_rss}


def _measure_command(model: str, kind: str, src: str, dst: str, budget: int) -> list[str]:
  return [sys.executable, os.path.abspath(__file__), '--measure', model, kind, src, dst, str(budget)]


def _why(err: str) -> str:
  """The line of a failed process's stderr that says why: a fatal or error
  log line of absl (a crash ends with its stack, which says nothing), or an
  exception's, else the last line."""
  lines = [line.strip() for line in err.splitlines() if line.strip()]
  said = [line for line in lines if re.match(r'[FE]\d{4} ', line) or re.match(r'\w+(Error|Exception)\b', line)]
  return (said or lines or ['no output'])[-1]


def _measured(proc: subprocess.Popen) -> dict:
  """A measuring process's figures, or its failure with the end of its stderr."""
  out, err = proc.communicate()
  if proc.returncode != 0:
    why = 'killed by the kernel (out of memory)' if proc.returncode == -9 else _why(err)
    return {'failed': f'exit {proc.returncode}: {why}', 'stderr_tail': err.splitlines()[-40:]}
  return json.loads(out.strip().splitlines()[-1])


def run_measurement(model: str, kind: str, src: str, dst: str, budget: int, env, cgroup=None) -> dict:
  """`kind` in fresh processes (two for a `_2_processes` kind), in `cgroup` if given."""
  # The previous measurement's files written back first: its pending writeback
  # (cp's above all, which does not sync) would slow the disk under this one.
  os.sync()
  join = None if cgroup is None else lambda: _join_cgroup(cgroup)
  if kind.endswith('_2_processes'):
    port = _free_port()
    command = _measure_command(model, kind.removesuffix('_2_processes'), src, dst, budget)
    procs = [
        subprocess.Popen(command + ['--process', str(p), str(port)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=join)
        for p in range(2)
    ]
    runs = [_measured(p) for p in procs]
    failed = [r['failed'] for r in runs if 'failed' in r]
    if failed:
      return {'failed': failed[0]}
    return {k: max(r[k] for r in runs) for k in ('seconds', 'peak_above_baseline')}
  proc = subprocess.Popen(
      _measure_command(model, kind, src, dst, budget), env=env, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=join,
  )
  return _measured(proc)


def _run(command: list[str], env=None) -> str:
  return subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout


def _free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def memory_cgroup(limit: int) -> str:
  """A new memory cgroup that holds its processes to `limit` bytes; its directory.

  Raises:
    PermissionError: no memory cgroup can be created here.
  """
  name = f'linen-nnx-bench-{os.getpid()}'
  tried = []
  # cgroup v1's memory hierarchy, then cgroup v2's (unified) one.
  for root, limit_file in (('/sys/fs/cgroup/memory', 'memory.limit_in_bytes'), ('/sys/fs/cgroup', 'memory.max')):
    if not os.path.exists(os.path.join(root, 'cgroup.procs')):
      continue
    path = os.path.join(root, name)
    try:
      os.mkdir(path)
    except OSError as e:
      tried.append(f'{root}: {e.strerror}')
      continue
    try:
      with open(os.path.join(path, limit_file), 'w') as f:
        f.write(str(limit))
      return path
    except OSError as e:
      tried.append(f'{path}/{limit_file}: {e.strerror}')
      os.rmdir(path)
  raise PermissionError(
      'cannot create a memory cgroup (' + ('; '.join(tried) or 'no cgroup hierarchy with a '
      'memory controller') + '); run as root, or in a delegated cgroup v2'
  )


def _join_cgroup(path: str) -> None:
  with open(os.path.join(path, 'cgroup.procs'), 'w') as f:
    f.write(str(os.getpid()))


KINDS = ('baseline', 'cp', 'same_layout', 'relayout', 'same_layout_2_processes')


def _size(text: str) -> int:
  units = {'KiB': 2**10, 'MiB': 2**20, 'GiB': 2**30}
  for unit, factor in units.items():
    if text.endswith(unit):
      return int(float(text[:-len(unit)]) * factor)
  return int(text)


def run_model(model: str, args, work: str, layers: int) -> dict:
  """Every measurement of `model`, `args.repeats` times in fresh processes, in turn."""
  kinds = KINDS + tuple(f'{k}_in_memory' for k in ('same_layout', 'relayout') if args.in_memory)
  env = {**os.environ, 'LINEN_NNX_BENCH_LAYERS': str(layers)}
  src = os.path.join(work, f'{model}-src')
  if model.startswith('transformer'):
    make = 'make_transformer_checkpoint(%r, %r)' % (src, model == 'transformer-weights')
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
      runs[kind].append(run_measurement(model, kind, src, dst, args.memory_budget, env))
      shutil.rmtree(dst, ignore_errors=True)
  limited = None
  if args.memory_limit:
    limited = {'limit_mib': args.memory_limit / 2**20, 'checkpoint_vs_limit': size / args.memory_limit}
    try:
      cgroup = memory_cgroup(args.memory_limit)
    except PermissionError as e:
      limited['skipped'] = str(e)
    else:
      try:
        for kind in ('baseline', 'same_layout'):
          dst = os.path.join(work, f'{model}-{kind}-limited')
          limited[kind] = run_measurement(model, kind, src, dst, args.memory_budget, env, cgroup)
          shutil.rmtree(dst, ignore_errors=True)
      finally:
        os.rmdir(cgroup)
  shutil.rmtree(src)

  described = (
      f'{layers} layers, depth {args.depth}' if model == 'mlp'
      else 'zoo transformer, {num_layers} blocks, width {width}, vocab {vocab_size}'.format(
          **{**TRANSFORMER, 'num_layers': layers})
  ) + (', weights only' if model == 'transformer-weights' else ', adam')
  results = {'model': described, 'checkpoint_bytes': size, 'runs': runs}

  def median(kind):
    done = [r['seconds'] for r in runs[kind] if 'failed' not in r]
    return statistics.median(done) if len(done) == len(runs[kind]) else None

  def ratio(a, b):
    return None if a is None or b is None else a / b

  medians = {k: median(k) for k in kinds}
  print(f'\n{model}: {described}: {size / 2**20:.0f} MiB, memory budget {args.memory_budget / 2**20:.0f} MiB')
  print(f'{"measurement":<28} {"s (median)":>11} {"vs Orbax":>9} {"vs cp":>7} {"peak above interpreter":>23}')
  show = lambda x, f: '-' if x is None else format(x, f)
  for kind in kinds:
    failures = [r['failed'] for r in runs[kind] if 'failed' in r]
    peak = max((r['peak_above_baseline'] for r in runs[kind] if 'failed' not in r), default=None)
    results[kind] = {
        'seconds': medians[kind],
        'time_ratio_vs_orbax': ratio(medians[kind], medians['baseline']),
        'time_ratio_vs_cp': ratio(medians[kind], medians['cp']),
        'peak_rss_above_interpreter_mib': None if peak is None else peak / 2**20,
        'memory_budget_mib': args.memory_budget / 2**20,
        **({'failed': failures[0]} if failures else {}),
    }
    row = results[kind]
    print(
        f'{kind:<28} {show(row["seconds"], ">11.2f")} {show(row["time_ratio_vs_orbax"], ">8.2f")}x '
        f'{show(row["time_ratio_vs_cp"], ">6.2f")}x {show(row["peak_rss_above_interpreter_mib"], ">19.0f")} MiB'
        + (f'  ({failures[0]})' if failures else '')
    )
  results['two_processes_vs_one'] = ratio(medians['same_layout_2_processes'], medians['same_layout'])
  print(f'two processes / one (same layout): {show(results["two_processes_vs_one"], ".2f")}x')
  if limited is not None:
    results['memory_limit'] = limited
    print(f'under a memory limit of {limited["limit_mib"]:.0f} MiB (the checkpoint is '
          f'{limited["checkpoint_vs_limit"]:.2f}x the limit):')
    if 'skipped' in limited:
      print(f'  skipped: {limited["skipped"]}')
    for kind in ('baseline', 'same_layout'):
      if kind in limited:
        r = limited[kind]
        print(f'  {kind:<26} ' + (r['failed'] if 'failed' in r else
              f'done in {r["seconds"]:.2f} s, peak {r["peak_above_baseline"] / 2**20:.0f} MiB above the interpreter'))
  return results


def peak_spreads(results: dict, model: str) -> dict:
  """The largest peak over the smallest across sizes: of each conversion kind
  (the goal's "two peaks": one conversion at two sizes), and of both kinds."""
  sized = [r for k, r in results.items() if k.startswith(f'{model}-') and isinstance(r, dict) and 'cp' in r]
  out = {}
  for name, kinds in (('same_layout', ('same_layout',)), ('relayout', ('relayout',)),
                      ('', ('same_layout', 'relayout'))):
    peaks = [
        r[k]['peak_rss_above_interpreter_mib'] for r in sized for k in kinds
        if r[k]['peak_rss_above_interpreter_mib'] is not None
    ]
    if len(sized) > 1 and peaks:
      out[f'{model}-{name + "-" if name else ""}peak_spread'] = max(peaks) / min(peaks)
      print(f'{model}: {name or "either kind"}: the largest peak is {max(peaks) / min(peaks):.2f}x the '
            f'smallest ({min(peaks):.0f} to {max(peaks):.0f} MiB) over {len(sized)} sizes')
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      '--models', nargs='+', choices=('mlp', 'transformer', 'transformer-weights'),
      default=['transformer', 'transformer-weights', 'mlp'],
  )
  parser.add_argument(
      '--layers', type=int, nargs='+', default=None,
      help='checkpoint sizes, as layers (default: transformer 4 = 1 GiB; MLP 40 = 960 MiB)',
  )
  parser.add_argument('--depth', type=int, default=1024)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--memory-budget', type=_size, default=2**30, help='bytes, or with KiB, MiB, GiB')
  parser.add_argument(
      '--memory-limit', type=_size, default=None,
      help='also run the baseline and the conversion in a memory cgroup of this size',
  )
  parser.add_argument('--in-memory', action='store_true', help='also measure the in-memory path')
  parser.add_argument('--json', default='benchmarks/results/checkpoint.json')
  parser.add_argument('--measure', nargs=5, metavar=('MODEL', 'KIND', 'SRC', 'DST', 'BUDGET'), help=argparse.SUPPRESS)
  parser.add_argument('--process', nargs=2, type=int, metavar=('ID', 'PORT'), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.measure:
    model, kind, src, dst, budget = args.measure
    if not args.process:
      print(json.dumps(measure(model, kind, src, dst, int(budget))))
      return
    try:
      figures = measure(model, kind, src, dst, int(budget), args.process)
    except BaseException:
      # Not JAX's shutdown barrier: the other process may be gone.
      traceback.print_exc()
      sys.stderr.flush()
      os._exit(1)
    print(json.dumps(figures), flush=True)
    # Both got here: the shutdown barrier keeps process 0, which hosts JAX's
    # coordination service, up until process 1 is done with it (a client that
    # loses the service aborts).
    import jax

    jax.distributed.shutdown()
    return

  work = tempfile.mkdtemp(prefix='linen-nnx-bench-')
  results = {}
  try:
    for model in args.models:
      sizes = args.layers or ([TRANSFORMER['num_layers']] if model.startswith('transformer') else [40])
      for layers in sizes:
        results[f'{model}-{layers}'] = run_model(model, args, work, layers)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  for model in args.models:
    results.update(peak_spreads(results, model))
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'\nwrote {args.json}')


if __name__ == '__main__':
  main()
