"""Benchmark: `linen-nnx port` on the model zoo, each model in a fresh process.

For each Linen model of the zoo, Flax's lm1b, imagenet ResNet and sst2, the kit's
MLP (and the port tests' models that cover the setup() style, own variables
and `make_rng`), the time to trace and write the NNX file
(`generated`), then the time of each proof (`assert_port_equivalent` at the
traced configuration, and the sum over the others: other sizes, each flag
such as `scan_layers`), as the command reports them, with
the outcome: proven, not proven, or the classes written as stubs (what the
port does not write yet); then the test file the port wrote, run with
pytest as the user's CI runs it (the proof, decoding, and a Linen
checkpoint converted by `linen-nnx convert --paths` and trained on). On 2
CPU cores, as CI runs. Prints a table and writes JSON to
benchmarks/results/port.json.

    python benchmarks/port.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FACTORIES = '''
import jax.numpy as jnp
from converters import LinenModel
from model_zoo import configs
from model_zoo.linen import cnn, resnet, rnn, transformer


def zoo_cnn():
  c = configs.CNNConfig()
  return LinenModel(cnn.CNN(c), jnp.ones((2, c.image_size, c.image_size, c.in_channels)), train=False)


def zoo_resnet():
  c = configs.ResNetConfig()
  return LinenModel(resnet.ResNet(c), jnp.ones((2, 16, 16, c.in_channels)), train=False)


def zoo_rnn():
  return LinenModel(rnn.RNNLM(configs.RNNConfig()), jnp.zeros((2, 5), jnp.int32))


def zoo_transformer():
  return LinenModel(transformer.TransformerLM(configs.TransformerConfig()), jnp.zeros((2, 8), jnp.int32))


def flax_lm1b():
  from tests.third_party.flax_lm1b import linen_models as lm1b

  config = lm1b.TransformerConfig(vocab_size=32, output_vocab_size=32, emb_dim=16, num_heads=2,
                                  num_layers=2, qkv_dim=16, mlp_dim=32, max_len=16)
  return LinenModel(lm1b.TransformerLM(config), jnp.zeros((2, 8), jnp.int32))


def kit_mlp(annotation='device'):
  import jax
  from kit_mlp.description import ModelDescription
  from linen_impl import model

  desc = ModelDescription(num_layers=2, depth=8, batch=4, mesh_shape=(1, 2), annotation=annotation)
  jax.set_mesh(desc.make_mesh())  # its constraints need the mesh (this process is the model's own)
  return LinenModel(model.MLP(desc), jnp.ones((desc.batch, desc.depth)))


def kit_mlp_logical():
  return kit_mlp('logical')
'''

MODELS = [
    ('bench_factories:zoo_cnn', 'zoo CNN'),
    ('bench_factories:zoo_resnet', 'zoo ResNet (BatchNorm)'),
    ('bench_factories:zoo_rnn', 'zoo LSTM LM'),
    ('bench_factories:zoo_transformer', 'zoo transformer LM'),
    ('bench_factories:flax_lm1b', "Flax's lm1b"),
    ('tests.converters.port.linen_models:flax_imagenet', "Flax's imagenet ResNet (stages [1, 1])"),
    ('tests.converters.port.linen_models:flax_imagenet_two_blocks_a_stage', "Flax's imagenet ResNet ([2, 2])"),
    ('tests.converters.port.linen_models:flax_sst2_by_its_call', "Flax's sst2 classifier (deterministic at the call)"),
    ('tests.converters.port.linen_models:noisy_embedder', 'make_rng (word dropout, noise)'),
    ('bench_factories:kit_mlp', "kit MLP (device axes)"),
    ('bench_factories:kit_mlp_logical', "kit MLP (logical names)"),
    ('tests.converters.port.linen_models:setup_stack', 'setup() style'),
    ('tests.converters.port.linen_models:counts', 'own variables, sow'),
]


def main() -> int:
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    with open(os.path.join(scratch, 'bench_factories.py'), 'w') as f:
      f.write(FACTORIES)
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([scratch, ROOT])}
    for factory, label in MODELS:
      out = os.path.join(scratch, factory.split(':')[1] + '_nnx.py')
      start = time.perf_counter()
      result = subprocess.run(
          [sys.executable, '-m', 'linen_nnx_cli.main', 'port', factory, '--out', out, '--json',
           '--devices', '2'],
          capture_output=True, text=True, cwd=scratch, env=env, timeout=900,
      )
      wall = time.perf_counter() - start
      try:
        report = json.loads(result.stdout)
        report['checks']
      except (ValueError, KeyError):
        print(f'{label}: linen-nnx port exited {result.returncode}: {result.stdout}{result.stderr}'[-2000:])
        return 1
      checks = {c['check'].split(' (')[0]: c for c in report['checks']}
      others = [c for c in report['checks'] if c['check'].startswith('another configuration')]
      unproven = [c['check'] for c in report['checks'] if c['outcome'] in ('FAILED', 'NOT PROVEN')]
      outcome = ('proven' if report['ok'] else
                 f'stubs: {", ".join(s["class"] for s in report["stubs"])}' if report['stubs']
                 else 'not proven: ' + '; '.join(unproven))
      # The test file the port wrote, run as the user's CI runs it: the proof
      # again, decoding, and a Linen checkpoint converted by `linen-nnx
      # convert --paths` and trained on (2 simulated devices, as the port ran).
      test_file = os.path.join(scratch, f'test_{os.path.basename(out)[:-3]}_port.py')
      start = time.perf_counter()
      written = subprocess.run(
          [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', test_file],
          capture_output=True, text=True, cwd=scratch, timeout=900,
          env={**env, 'XLA_FLAGS': '--xla_force_host_platform_device_count=2'},
      )
      test_seconds = time.perf_counter() - start
      test_outcome = (written.stdout.strip().splitlines() or ['?'])[-1].strip('= ')
      seconds = lambda figure: float(figure.split()[0]) if figure and figure[0].isdigit() else 0.0
      rows.append({
          'model': label, 'outcome': outcome, 'wall_s': round(wall, 2),
          'generated': checks.get('generated', {}).get('figure', ''),
          'proof': checks.get('assert_port_equivalent', {}).get('figure', ''),
          'other_configurations': f'{sum(seconds(c["figure"]) for c in others):.2f} s ({len(others)})',
          'written_test_s': round(test_seconds, 1), 'written_test': test_outcome,
      })
  width = max(len(r['model']) for r in rows)
  print(f'{"model":<{width}}  {"wall":>7}  {"generated":>9}  {"proof":>7}  {"others (n)":>12}  '
        f'{"written test":>12}  outcome')
  for r in rows:
    print(f'{r["model"]:<{width}}  {r["wall_s"]:>6.1f}s  {r["generated"]:>9}  {r["proof"]:>7}  '
          f'{r["other_configurations"]:>12}  {r["written_test_s"]:>6.1f}s {r["written_test"][:20]:<20}  '
          f'{r["outcome"]}')
  os.makedirs(os.path.join(ROOT, 'benchmarks', 'results'), exist_ok=True)
  with open(os.path.join(ROOT, 'benchmarks', 'results', 'port.json'), 'w') as f:
    json.dump(rows, f, indent=2)
  return 0


if __name__ == '__main__':
  sys.exit(main())
