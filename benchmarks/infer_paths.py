"""Benchmark: inferring the path mapping of large models, without materialising them.

The model zoo's transformer LM at 24 blocks of width 1024 (16 heads, MLP
4096, a 32k vocabulary: about 1.3 GiB of float32 parameters), looped,
scanned, and across layouts (the Linen model scans, the port loops: both
traced again with the scan unrolled), and the kit's 64-layer depth-1024 MLP (256 MiB): `infer_paths` on
the Linen module and the abstract NNX port (`nnx.eval_shape`). Each model runs
in a fresh process, which reports the wall time of `infer_paths` and its peak
resident memory above what the process held before the call (JAX loaded, the
abstract model built); the parameters' own size is the reference (goals:
under 2 s, peak below 10% of the parameter bytes). Beside it, in fresh
processes of the same run, the time of tracing both forward passes alone,
the floor of any inference (goal: inference within 4x of it). The time includes the
witness: both models run on the example input (one sequence of 16 tokens;
a batch of 8 for the MLP) with every variable drawn, one at a time. Prints a table and writes
JSON with `seconds`, `peak_rss_mib` and `param_mib` per model.

    python benchmarks/infer_paths.py [--blocks 24] [--width 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH = (2, 4)


def _rss_bytes() -> int:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _peak_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(model: str, blocks: int, width: int, what: str = 'infer') -> dict:
  """One measurement in this (fresh) process: of `infer_paths`, or (`what
  == 'trace'`) of tracing both forward passes alone, the floor any
  inference pays."""
  sys.path.insert(0, ROOT)
  from linen_nnx_cli.devices import simulate_cpu_devices

  simulate_cpu_devices(8)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import linen as nn
  from flax import nnx
  from jax.sharding import AxisType

  from converters import infer_paths

  mesh = jax.make_mesh(MESH, ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
  if model.startswith('transformer'):
    from model_zoo.configs import RULES, TransformerConfig
    from model_zoo.linen.transformer import TransformerLM as LinenLM
    from model_zoo.nnx.transformer import TransformerLM as NNXLM

    config = TransformerConfig(
        vocab_size=32_000, width=width, num_heads=16, mlp_dim=4 * width, num_layers=blocks,
        max_len=1024, scan_layers=model.endswith(('scan', 'across')),
    )
    # across: the Linen model scans its layers, the port loops them.
    port_config = dataclasses.replace(config, scan_layers=model.endswith('scan'))
    linen, rules = LinenLM(config), RULES
    make_nnx = lambda: NNXLM(port_config, idiom='rules_metadata', rngs=nnx.Rngs(0))
    inputs = jax.ShapeDtypeStruct((1, 16), jnp.int32)  # an example input, as users give one
  else:
    from kit_mlp.description import ModelDescription
    from linen_impl.model import MLP as LinenMLP
    from nnx_impl.model import MLP as NNXMLP

    desc = ModelDescription(num_layers=64, depth=1024, batch=8, mesh_shape=MESH)
    linen, rules = LinenMLP(desc), None
    make_nnx = lambda: NNXMLP(desc, rngs=nnx.Rngs(0))
    inputs = jax.ShapeDtypeStruct((8, 1024), jnp.float32)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules or ()):
    abstract = nnx.eval_shape(make_nnx)
    abstract.eval()
    param_bytes = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in jax.tree.leaves(nnx.state(abstract, nnx.Param))
    )
    baseline = _rss_bytes()
    start = time.perf_counter()
    if what == 'trace':
      from converters.inference.traces import Call, trace_linen, trace_nnx
      from converters.variable_types import CollectionTable

      trace_linen(linen, Call((inputs,)))
      trace_nnx(abstract, Call((inputs,)), CollectionTable(None))
      rules = 0
    else:
      rules = len(infer_paths(linen, abstract, inputs).rules)
    seconds = time.perf_counter() - start
  return {
      'seconds': seconds, 'peak_above_start': max(0, _peak_bytes() - baseline),
      'param_bytes': param_bytes, 'rules': rules,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--blocks', type=int, default=24)
  parser.add_argument('--width', type=int, default=1024)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--json', default='benchmarks/results/infer_paths.json')
  parser.add_argument('--measure', metavar='MODEL', help=argparse.SUPPRESS)
  parser.add_argument('--what', default='infer', choices=('infer', 'trace'), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.measure:
    print(json.dumps(measure(args.measure, args.blocks, args.width, args.what)))
    return

  def fresh(model: str, what: str) -> dict:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), '--measure', model, '--what', what,
         '--blocks', str(args.blocks), '--width', str(args.width)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])

  results = {}
  print(f'{"model":<20} {"s (median)":>10} {"trace s":>8} {"s/trace":>8} {"peak MiB":>9} '
        f'{"param MiB":>10} {"peak/params":>12} {"rules":>6}')
  for model in ('transformer-loop', 'transformer-scan', 'transformer-across', 'mlp'):
    # Side by side in one run: inference, then tracing alone, each in a fresh process.
    runs, traces = [], []
    for _ in range(args.repeats):
      runs.append(fresh(model, 'infer'))
      traces.append(fresh(model, 'trace'))
    seconds = statistics.median(r['seconds'] for r in runs)
    tracing = statistics.median(r['seconds'] for r in traces)
    peak = max(r['peak_above_start'] for r in runs)
    params = runs[0]['param_bytes']
    results[model] = {
        'seconds': seconds, 'trace_seconds': tracing, 'over_tracing': seconds / tracing,
        'peak_rss_mib': peak / 2**20, 'param_mib': params / 2**20,
        'peak_over_params': peak / params, 'rules': runs[0]['rules'], 'runs': runs,
        'trace_runs': traces,
    }
    print(
        f'{model:<20} {seconds:>10.2f} {tracing:>8.2f} {seconds / tracing:>7.1f}x '
        f'{peak / 2**20:>9.0f} {params / 2**20:>10.0f} {peak / params:>11.1%} {runs[0]["rules"]:>6}'
    )
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'\nwrote {args.json}')


if __name__ == '__main__':
  main()
