"""Benchmark: NNX train-step time over Linen train-step time, in one run.

For depth 128 and 1024, 4 layers, scanned and looped, on a 2x4 mesh of
simulated CPU devices: the Linen `jax.jit` step, the kit's NNX step (split once,
`jax.jit` over the state) and, for reference, a plain `nnx.jit` step over the
model and optimizer objects are run in turn, step after step, so that machine
noise hits all of them alike. Reports the median of each after warm-up and the
ratios to Linen (goal: kit NNX / Linen <= 1.00). Prints a table and writes JSON.

    python benchmarks/train_step.py [--steps 50] [--warmup 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from linen_nnx_cli.devices import simulate_cpu_devices  # noqa: E402

simulate_cpu_devices(8)

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from kit_mlp.data import make_batches  # noqa: E402
from kit_mlp.description import ModelDescription  # noqa: E402
from kit_mlp.optimizers import make_tx  # noqa: E402
from linen_impl import train as linen_train  # noqa: E402
from nnx_impl import train as nnx_train  # noqa: E402


def timed(fn, *args):
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - start, out


def measure(desc: ModelDescription, optimizer: str, steps: int, warmup: int) -> dict:
  mesh = desc.make_mesh()
  linen = linen_train.make_trainer(desc, mesh, make_tx(optimizer))
  kit = nnx_train.make_trainer(desc, mesh, optimizer)
  with jax.set_mesh(mesh):
    x, y = make_batches(desc, mesh, seed=1)
    linen_state = linen.create(seed=0)
    kit_state = kit.create(seed=0)
    model, opt = kit.merge(kit.create(seed=0))
    plain_step = nnx.jit(
        lambda m, o, x, y: kit.step_fn(m, o, x, y), donate_argnums=(0, 1)
    )
    plain = lambda: plain_step(model, opt, x, y)

    times = {'linen': [], 'nnx_kit': [], 'nnx_jit': []}
    for i in range(warmup + steps):
      t_linen, (linen_state, _) = timed(linen.train_step, linen_state, x, y)
      t_kit, (kit_state, _) = timed(kit.train_step, kit_state, x, y)
      t_plain, _ = timed(plain)
      if i >= warmup:
        times['linen'].append(t_linen)
        times['nnx_kit'].append(t_kit)
        times['nnx_jit'].append(t_plain)
  medians = {k: statistics.median(v) for k, v in times.items()}
  return {
      'depth': desc.depth,
      'layers': desc.num_layers,
      'layout': 'scan' if desc.use_scan else 'loop',
      'mesh': 'x'.join(map(str, desc.mesh_shape)),
      'optimizer': optimizer,
      'steps': steps,
      'median_ms': {k: v * 1e3 for k, v in medians.items()},
      'ratio_nnx_kit_over_linen': medians['nnx_kit'] / medians['linen'],
      'ratio_nnx_jit_over_linen': medians['nnx_jit'] / medians['linen'],
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=50)
  parser.add_argument('--warmup', type=int, default=5)
  parser.add_argument('--optimizer', default='adam')
  parser.add_argument('--json', default='benchmarks/results/train_step.json')
  args = parser.parse_args()
  if args.steps < 30:
    parser.error('--steps must be at least 30 for a stable median')

  results = []
  for depth in (128, 1024):
    for use_scan in (False, True):
      desc = ModelDescription(num_layers=4, depth=depth, batch=8, use_scan=use_scan)
      results.append(measure(desc, args.optimizer, args.steps, args.warmup))

  header = f'{"depth":>5} {"layout":>6} {"linen ms":>9} {"nnx kit ms":>10} {"nnx.jit ms":>10} {"kit/linen":>9} {"jit/linen":>9}'
  print(header)
  print('-' * len(header))
  for r in results:
    m = r['median_ms']
    print(
        f'{r["depth"]:>5} {r["layout"]:>6} {m["linen"]:>9.3f} {m["nnx_kit"]:>10.3f} '
        f'{m["nnx_jit"]:>10.3f} {r["ratio_nnx_kit_over_linen"]:>9.3f} '
        f'{r["ratio_nnx_jit_over_linen"]:>9.3f}'
    )
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump({'jax': jax.__version__, 'results': results}, f, indent=2)
  print(f'\nwrote {args.json}')


if __name__ == '__main__':
  main()
