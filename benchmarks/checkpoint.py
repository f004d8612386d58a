"""Benchmark: converting a ~1 GB checkpoint against a plain Orbax restore-and-save.

A Linen `TrainState` (40 layers, depth 1024, adam: 960 MiB of float32) is
saved with `linen_impl.checkpoint`. Then, in fresh processes run in turn, each
measurement once per repeat:

- baseline: the Linen trainer restores the checkpoint into its shardings and
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
baseline <= 1.5x the checkpoint size. Prints a table and writes JSON.

    python benchmarks/checkpoint.py [--layers 40] [--depth 1024] [--repeats 3]
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


def measure(kind: str, src: str, dst: str) -> dict:
  """One measurement in this (fresh) process."""
  jax = _setup_jax()
  # Everything either kind uses is imported before the interpreter's baseline
  # is taken: loaded libraries are not memory the work uses.
  from converters.checkpoint import inspect as checkpoints
  from converters.checkpoint import kit
  from converters.checkpoint.convert import convert_checkpoint
  from converters.checkpoint.verify import verify
  from linen_impl import checkpoint

  baseline_rss = _rss_bytes()
  start = time.perf_counter()
  if kind.startswith('baseline'):
    described = kit.describe(checkpoints.inspect(src))
    desc = kit.description(described, MESH)
    mesh = desc.make_mesh()
    trainer = kit.trainer_for('linen', desc, mesh, described.optimizer)
    with jax.set_mesh(mesh):
      state = checkpoint.restore(src, trainer)
      checkpoint.save(dst, state)
      if kind == 'baseline_readback':
        verify(dst, state)
  else:
    layout = 'scan' if kind == 'convert_scan' else None
    convert_checkpoint(src, dst, 'nnx', layout=layout, mesh_shape=MESH)
  seconds = time.perf_counter() - start
  return {'seconds': seconds, 'peak_above_baseline': _peak_bytes() - baseline_rss}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--layers', type=int, default=40)
  parser.add_argument('--depth', type=int, default=1024)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--json', default='benchmarks/results/checkpoint.json')
  parser.add_argument('--measure', nargs=3, metavar=('KIND', 'SRC', 'DST'), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.measure:
    print(json.dumps(measure(*args.measure)))
    return

  kinds = ('baseline', 'baseline_readback', 'convert', 'convert_scan')
  work = tempfile.mkdtemp(prefix='linen-nnx-bench-')
  try:
    src = os.path.join(work, 'src')
    command = [sys.executable, '-c', (
        'import sys; sys.path.insert(0, %r); from benchmarks.checkpoint import '
        'make_checkpoint; print(make_checkpoint(%r, %d, %d))'
    ) % (ROOT, src, args.layers, args.depth)]
    size = int(subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()[-1])
    runs = {k: [] for k in kinds}
    for _ in range(args.repeats):
      for kind in kinds:
        dst = os.path.join(work, kind)
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), '--measure', kind, src, dst],
            check=True, capture_output=True, text=True,
        ).stdout
        runs[kind].append(json.loads(out.strip().splitlines()[-1]))
        shutil.rmtree(dst)
  finally:
    shutil.rmtree(work, ignore_errors=True)

  results = {'layers': args.layers, 'depth': args.depth, 'checkpoint_bytes': size, 'runs': runs}
  base = statistics.median(r['seconds'] for r in runs['baseline'])
  print(f'checkpoint: {args.layers} layers, depth {args.depth}, adam: {size / 2**20:.0f} MiB')
  print(f'{"measurement":<18} {"s (median)":>11} {"vs baseline":>12} {"peak above baseline":>20} {"x size":>7}')
  for kind in kinds:
    seconds = statistics.median(r['seconds'] for r in runs[kind])
    peak = max(r['peak_above_baseline'] for r in runs[kind])
    results[kind] = {
        'seconds': seconds, 'time_ratio': seconds / base,
        'peak_above_baseline': peak, 'peak_over_size': peak / size,
    }
    print(
        f'{kind:<18} {seconds:>11.2f} {seconds / base:>11.2f}x '
        f'{peak / 2**20:>16.0f} MiB {peak / size:>6.2f}x'
    )
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'\nwrote {args.json}')


if __name__ == '__main__':
  main()
