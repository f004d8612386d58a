"""Benchmark: conversion cost of a 64-layer, depth-1024 MLP (512 MiB of float32).

Same layout (Linen loop -> NNX loop, and back): wall time and bytes of array
data copied, counted shard by shard from device buffer addresses (goal: zero
bytes, under 50 ms of tree bookkeeping). Relayout (Linen loop -> NNX scan, NNX
scan -> Linen loop): achieved bandwidth against a plain on-device copy of the
same arrays with the same output shardings, measured in the same run (goal: at
least 0.5x). Medians over repeats after a warm-up call; prints a table and
writes JSON.

    python benchmarks/convert.py [--layers 64] [--depth 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from converters.devices import simulate_cpu_devices  # noqa: E402

simulate_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from converters import linen_to_nnx, nnx_to_linen  # noqa: E402
from converters.description import ModelDescription  # noqa: E402
from linen_impl import train as linen_train  # noqa: E402


def buffers(tree) -> dict[int, int]:
  """Device buffer address -> bytes, for every shard of every array in `tree`."""
  out = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      out[shard.data.unsafe_buffer_pointer()] = shard.data.nbytes
  return out


def copied_bytes(source, result) -> int:
  before = buffers(source)
  return sum(n for ptr, n in buffers(result).items() if ptr not in before)


def timed(fn, repeats: int) -> tuple[float, object]:
  out = jax.block_until_ready(fn())  # warm-up (compiles a relayout once)
  times = []
  for _ in range(repeats):
    del out
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times), out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--layers', type=int, default=64)
  parser.add_argument('--depth', type=int, default=1024)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--json', default='benchmarks/results/convert.json')
  args = parser.parse_args()

  desc = ModelDescription(num_layers=args.layers, depth=args.depth, batch=8)
  mesh = desc.make_mesh()
  trainer = linen_train.make_trainer(desc, mesh, optax.identity())
  with jax.set_mesh(mesh):
    variables = {'params': trainer.create(seed=0).params}
  total = sum(x.nbytes for x in jax.tree.leaves(variables))
  results = {'layers': args.layers, 'depth': args.depth, 'param_bytes': total}

  t, nnx_state = timed(lambda: linen_to_nnx(variables), args.repeats)
  results['linen_to_nnx_same_layout'] = {
      'ms': t * 1e3, 'copied_bytes': copied_bytes(variables, nnx_state)
  }
  t, back = timed(lambda: nnx_to_linen(nnx_state), args.repeats)
  results['nnx_to_linen_same_layout'] = {
      'ms': t * 1e3, 'copied_bytes': copied_bytes(nnx_state, back)
  }

  # Baseline: the same arrays copied on device into the same shardings.
  leaves = jax.tree.leaves(variables)
  plain_copy = jax.jit(
      lambda xs: [jnp.copy(x) for x in xs], out_shardings=[x.sharding for x in leaves]
  )
  t_copy, _ = timed(lambda: plain_copy(leaves), args.repeats)
  results['plain_copy'] = {'ms': t_copy * 1e3, 'GBps': total / t_copy / 1e9}

  t, stacked = timed(lambda: linen_to_nnx(variables, scan=True), args.repeats)
  results['linen_loop_to_nnx_scan'] = {
      'ms': t * 1e3, 'GBps': total / t / 1e9, 'vs_plain_copy': t_copy / t
  }
  t, _ = timed(lambda: nnx_to_linen(stacked, scan=False), args.repeats)
  results['nnx_scan_to_linen_loop'] = {
      'ms': t * 1e3, 'GBps': total / t / 1e9, 'vs_plain_copy': t_copy / t
  }
  assert isinstance(stacked, nnx.State)

  print(f'{args.layers} layers, depth {args.depth}: {total / 2**20:.0f} MiB of parameters')
  print(f'{"conversion":<28} {"ms":>9} {"copied bytes":>13} {"GB/s":>7} {"vs copy":>8}')
  for key in (
      'linen_to_nnx_same_layout', 'nnx_to_linen_same_layout', 'plain_copy',
      'linen_loop_to_nnx_scan', 'nnx_scan_to_linen_loop',
  ):
    r = results[key]
    copied = str(r['copied_bytes']) if 'copied_bytes' in r else ''
    gbps = f'{r["GBps"]:.2f}' if 'GBps' in r else ''
    ratio = f'{r["vs_plain_copy"]:.2f}x' if 'vs_plain_copy' in r else ''
    print(f'{key:<28} {r["ms"]:>9.2f} {copied:>13} {gbps:>7} {ratio:>8}')
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'\nwrote {args.json}')


if __name__ == '__main__':
  main()
