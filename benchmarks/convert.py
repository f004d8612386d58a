"""Benchmark: conversion cost of a 64-layer, depth-1024 MLP (512 MiB of float32) and of the zoo transformer.

Same layout (Linen loop -> NNX loop, and back): wall time and bytes of array
data copied, counted shard by shard from device buffer addresses (goal: zero
bytes, under 50 ms of tree bookkeeping). The same for the model zoo's
transformer LM at its realistic size (12 blocks of width 512, vocabulary
32000, logical rules from the context, looped and scanned): Linen -> NNX
state, Linen -> the NNX port (an abstract target, the mesh-axes idiom, so
the forms differ and the target's is written), and back. And Linen -> the
port with fused attention (value transforms: query, key and value kernels
fused into one, the out kernel flattened): the rearranged kernels are the
only bytes copied, timed against a plain on-device copy of those kernels.

Relayout (Linen loop -> NNX scan, NNX scan -> Linen loop): achieved bandwidth
against a plain on-device copy of the same arrays into the same shardings
(goal: at least 0.5x). The relayouts and both copies (of the looped and of the
stacked arrays) run in turn, repeat after repeat, and medians are reported.

On CPU a relayout writes fresh buffers, and glibc serves large buffers (a
stacked shard is 64 MiB per device here, beyond what its per-thread arenas
hold) with freshly mapped pages, so every call pays a page fault per 4 KiB
written, while the 1 MiB looped shards are recycled from the heap. Any write
of stacked-size buffers pays the same, a plain copy included, so the
measurement runs three times, each in its own process: with the default
allocator; with glibc recycling buffers of every size as the `linen-nnx`
command sets it up at start-up (`converters.allocator.recycle_large_buffers`,
mallopt); and with the same asked for by GLIBC_TUNABLES (one arena, a high
mmap threshold). Prints one table and writes JSON.

    python benchmarks/convert.py [--layers 64] [--depth 1024] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ALLOCATORS = {
    'default': None,
    # What `linen-nnx` does at start-up (mallopt, in the process itself).
    'mallopt': None,
    # One arena, and a 4 GiB mmap threshold (above any buffer here): freed
    # buffers of every size return to the heap and are reused, not unmapped.
    'recycling': (
        'glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296'
        ':glibc.malloc.arena_max=1'
    ),
}


def buffers(tree) -> dict[int, int]:
  """Device buffer address -> bytes, for every shard of every array in `tree`."""
  import jax

  out = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      out[shard.data.unsafe_buffer_pointer()] = shard.data.nbytes
  return out


def copied_bytes(source, result) -> int:
  before = buffers(source)
  return sum(n for ptr, n in buffers(result).items() if ptr not in before)


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
  """Median seconds of each function, run in turn so noise hits all alike."""
  import jax

  times = {name: [] for name in fns}
  for fn in fns.values():
    jax.block_until_ready(fn())  # warm-up: compiles each relayout once
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      out = jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
      del out
  return {name: statistics.median(t) for name, t in times.items()}


def measure(layers: int, depth: int, repeats: int, allocator: str = 'default') -> dict:
  """Runs every measurement in this process; returns the figures."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from linen_nnx_cli.devices import simulate_cpu_devices

  simulate_cpu_devices(8)
  if allocator == 'mallopt':
    from converters.allocator import recycle_large_buffers

    assert recycle_large_buffers(), 'glibc refused the settings'

  import jax
  import jax.numpy as jnp
  import optax

  from converters import KIT_PATHS, linen_to_nnx, nnx_to_linen
  from kit_mlp.description import ModelDescription
  from linen_impl import train as linen_train

  desc = ModelDescription(num_layers=layers, depth=depth, batch=8)
  mesh = desc.make_mesh()
  trainer = linen_train.make_trainer(desc, mesh, optax.identity())
  with jax.set_mesh(mesh):
    variables = {'params': trainer.create(seed=0).params}
  total = sum(x.nbytes for x in jax.tree.leaves(variables))
  results = {'param_bytes': total}

  same = interleaved({'linen_to_nnx': lambda: linen_to_nnx(variables, paths=KIT_PATHS)}, repeats)
  nnx_state = linen_to_nnx(variables, paths=KIT_PATHS)
  same |= interleaved({'nnx_to_linen': lambda: nnx_to_linen(nnx_state, paths=KIT_PATHS)}, repeats)
  results['linen_to_nnx_same_layout'] = {
      'ms': same['linen_to_nnx'] * 1e3,
      'copied_bytes': copied_bytes(variables, linen_to_nnx(variables, paths=KIT_PATHS)),
  }
  results['nnx_to_linen_same_layout'] = {
      'ms': same['nnx_to_linen'] * 1e3,
      'copied_bytes': copied_bytes(nnx_state, nnx_to_linen(nnx_state, paths=KIT_PATHS)),
  }

  stacked = linen_to_nnx(variables, scan=True, paths=KIT_PATHS)
  looped_leaves = jax.tree.leaves(variables)
  stacked_leaves = jax.tree.leaves(stacked)

  def plain_copy(leaves):
    return jax.jit(
        lambda xs: [jnp.copy(x) for x in xs], out_shardings=[x.sharding for x in leaves]
    )

  copy_looped, copy_stacked = plain_copy(looped_leaves), plain_copy(stacked_leaves)
  t = interleaved(
      {
          'copy_looped': lambda: copy_looped(looped_leaves),
          'copy_stacked': lambda: copy_stacked(stacked_leaves),
          'loop_to_scan': lambda: linen_to_nnx(variables, scan=True, paths=KIT_PATHS),
          'scan_to_loop': lambda: nnx_to_linen(stacked, scan=False, paths=KIT_PATHS),
      },
      repeats,
  )
  for key in ('copy_looped', 'copy_stacked'):
    results[key] = {'ms': t[key] * 1e3, 'GBps': total / t[key] / 1e9}
  # The copy of a relayout's own source arrays is the goal's baseline; the
  # copy of the other layout writes buffers of the same sizes as the result.
  for key, name, source, result in (
      ('linen_loop_to_nnx_scan', 'loop_to_scan', 'copy_looped', 'copy_stacked'),
      ('nnx_scan_to_linen_loop', 'scan_to_loop', 'copy_stacked', 'copy_looped'),
  ):
    results[key] = {
        'ms': t[name] * 1e3,
        'GBps': total / t[name] / 1e9,
        'vs_copy_of_source': t[source] / t[name],
        'vs_copy_of_result_layout': t[result] / t[name],
    }
  return results


def measure_zoo_transformer(repeats: int) -> dict:
  """Same-layout conversions of the zoo transformer, looped and scanned; call after `measure`."""
  import dataclasses

  import jax
  from flax import linen as nn
  from flax import nnx
  from jax.sharding import AxisType

  import jax.numpy as jnp

  from converters import PathMapping, PathRule, Rearrange, linen_to_nnx, nnx_to_linen
  from model_zoo import paths as zoo_paths
  from model_zoo.configs import RULES, TransformerConfig
  from model_zoo.linen import transformer as linen_tf
  from model_zoo.nnx import transformer as nnx_tf

  def mapping(table):
    return PathMapping([
        PathRule(row.linen, row.nnx, row.linen_stacked, row.nnx_stacked,
                 transform=Rearrange(row.pattern, **dict(row.sizes)) if row.pattern else None)
        for rows in table.values() for row in rows
    ])

  paths = mapping(zoo_paths.TRANSFORMER)
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
  results = {}
  for scan in (False, True):
    config = dataclasses.replace(TransformerConfig.realistic(), scan_layers=scan)
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
      linen = linen_tf.TransformerLM(config)
      x = jax.numpy.zeros((8, 16), jax.numpy.int32)
      abstract = jax.eval_shape(linen.init, jax.random.key(0), x)
      shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, RULES)
      variables = jax.jit(linen.init, out_shardings=shardings)(jax.random.key(0), x)
      target = nnx.eval_shape(lambda: nnx_tf.TransformerLM(config, idiom='mesh_axes', rngs=nnx.Rngs(0)))
      state = linen_to_nnx(variables, paths=paths)
      model = linen_to_nnx(variables, target=target, paths=paths, rngs=0)
      fused_paths = mapping(zoo_paths.transformer_fused_attention(config.num_heads))
      kernels = [
          v for p, v in jax.tree_util.tree_leaves_with_path(nn.unbox(variables))
          if 'attention' in jax.tree_util.keystr(p)
      ]
      copy_kernels = jax.jit(lambda xs: [jnp.copy(x) for x in xs], out_shardings=[x.sharding for x in kernels])
      t = interleaved({
          'linen_to_nnx_state': lambda: linen_to_nnx(variables, paths=paths),
          'linen_to_nnx_model': lambda: linen_to_nnx(variables, target=target, paths=paths, rngs=0),
          'nnx_to_linen': lambda: nnx_to_linen(state, paths=paths),
          'linen_to_nnx_fused_attention': lambda: linen_to_nnx(variables, paths=fused_paths),
          'copy_attention_kernels': lambda: copy_kernels(kernels),
      }, repeats)
      copied = {
          'linen_to_nnx_state': copied_bytes(variables, state),
          'linen_to_nnx_model': copied_bytes(variables, nnx.state(model)),
          'nnx_to_linen': copied_bytes(state, nnx_to_linen(state, paths=paths)),
          'linen_to_nnx_fused_attention': copied_bytes(variables, linen_to_nnx(variables, paths=fused_paths)),
          'copy_attention_kernels': copied_bytes(kernels, copy_kernels(kernels)),
      }
    layout = 'scan' if scan else 'loop'
    results[layout] = {
        'param_bytes': sum(x.nbytes for x in jax.tree.leaves(variables)),
        **{k: {'ms': t[k] * 1e3, 'copied_bytes': copied[k]} for k in t},
    }
    results[layout]['fused_attention_vs_copy'] = t['copy_attention_kernels'] / t['linen_to_nnx_fused_attention']
  return results


def run_child(allocator: str, args) -> dict:
  env = dict(os.environ)
  if ALLOCATORS[allocator]:
    env['GLIBC_TUNABLES'] = ALLOCATORS[allocator]
  with tempfile.NamedTemporaryFile(suffix='.json') as f:
    command = [
        sys.executable, os.path.abspath(__file__), '--allocator', allocator,
        '--layers', str(args.layers), '--depth', str(args.depth),
        '--repeats', str(args.repeats), '--json', f.name,
    ]
    subprocess.run(command, env=env, check=True)
    with open(f.name) as g:
      return json.load(g)


def print_table(layers: int, depth: int, runs: dict[str, dict]) -> None:
  total = next(iter(runs.values()))['param_bytes']
  print(f'{layers} layers, depth {depth}: {total / 2**20:.0f} MiB of parameters, mesh 2x4')
  header = f'{"allocator":<10} {"measurement":<26} {"ms":>8} {"copied B":>9} {"GB/s":>6}'
  print(header + f' {"vs copy of source":>18} {"vs copy, result layout":>23}')
  for allocator, r in runs.items():
    for key in (
        'linen_to_nnx_same_layout', 'nnx_to_linen_same_layout', 'copy_looped',
        'copy_stacked', 'linen_loop_to_nnx_scan', 'nnx_scan_to_linen_loop',
    ):
      row = r[key]
      copied = str(row['copied_bytes']) if 'copied_bytes' in row else ''
      gbps = f'{row["GBps"]:.2f}' if 'GBps' in row else ''
      source = f'{row["vs_copy_of_source"]:.2f}x' if 'vs_copy_of_source' in row else ''
      result = (
          f'{row["vs_copy_of_result_layout"]:.2f}x'
          if 'vs_copy_of_result_layout' in row else ''
      )
      print(
          f'{allocator:<10} {key:<26} {row["ms"]:>8.2f} {copied:>9} {gbps:>6}'
          f' {source:>18} {result:>23}'
      )
  print('\nzoo transformer, 12 blocks of width 512 (same layout; goal: 0 bytes copied, < 50 ms)')
  for allocator, r in runs.items():
    for layout, figures in r['zoo_transformer'].items():
      mib = figures['param_bytes'] / 2**20
      for key in (
          'linen_to_nnx_state', 'linen_to_nnx_model', 'nnx_to_linen',
          'linen_to_nnx_fused_attention', 'copy_attention_kernels',
      ):
        row = figures[key]
        print(f'{allocator:<10} {layout} ({mib:.0f} MiB) {key:<28} {row["ms"]:>8.2f} ms {row["copied_bytes"]:>9} B copied')
      print(f'{allocator:<10} {layout} fused attention: {figures["fused_attention_vs_copy"]:.2f}x the speed of a plain copy of its kernels')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--layers', type=int, default=64)
  parser.add_argument('--depth', type=int, default=1024)
  parser.add_argument('--repeats', type=int, default=7)
  parser.add_argument('--json', default='benchmarks/results/convert.json')
  parser.add_argument(
      '--allocator', choices=('both', *ALLOCATORS), default='both',
      help='run in this process with the current allocator, or both in subprocesses',
  )
  args = parser.parse_args()

  if args.allocator != 'both':
    results = {'allocator': args.allocator, **measure(args.layers, args.depth, args.repeats, args.allocator)}
    results['zoo_transformer'] = measure_zoo_transformer(args.repeats)
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=2)
    return
  glibc = platform.libc_ver()[0] == 'glibc'
  allocators = list(ALLOCATORS) if glibc else ['default']
  runs = {a: run_child(a, args) for a in allocators}
  print_table(args.layers, args.depth, runs)
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump({'layers': args.layers, 'depth': args.depth, 'runs': runs}, f, indent=2)
  print(f'\nwrote {args.json}')


if __name__ == '__main__':
  main()
