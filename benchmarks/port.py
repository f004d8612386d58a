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

    python benchmarks/port.py [--public DIR] [--only TEXT]

`--public DIR` adds the public Linen models the port was tried on (`PUBLIC`:
Flax's examples, google-research/vision_transformer, big_vision, a DiT,
scico, gemma, scenic), their source unchanged in `DIR/<case>/` as each row
says where from, and `einops`, `immutabledict` and `ml-collections` in
`DIR/_deps` (`pip install --target DIR/_deps ...`). Their factories (the
configuration tried, small) are the benchmark's own, written to its scratch
folder: nothing is written in DIR.
"""

from __future__ import annotations

import argparse
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


#: `(case, factory, label, where the source comes from)`: `DIR/<case>` holds
#: that source; `bench_<case>.py` in the scratch folder, `PUBLIC_FACTORIES[case]`,
#: makes the model.
PUBLIC = [
    ('vae', 'make', "Flax's vae", 'google/flax examples/vae/models.py'),
    ('ppo', 'make', "Flax's ppo", 'google/flax examples/ppo/models.py'),
    ('nlp_seq', 'make', "Flax's nlp_seq", 'google/flax examples/nlp_seq/models.py'),
    ('imagenet', 'make64', "Flax's imagenet ResNet18, 64 px", 'google/flax examples/imagenet/models.py'),
    ('imagenet', 'make', "Flax's imagenet ResNet18, 32 px", 'google/flax examples/imagenet/models.py'),
    ('dit', 'make', 'DiT', 'kvfrans/jax-diffusion-transformer diffusion_transformer.py'),
    ('dncnn', 'make', "scico's DnCNN", 'lanl/scico scico/flax/_models.py (the scico package)'),
    ('mixer', 'make', "vit_jax's Mixer", 'google-research/vision_transformer vit_jax/'),
    ('vit', 'make', "vit_jax's ViT", 'google-research/vision_transformer vit_jax/'),
    ('vit', 'make_hybrid', "vit_jax's hybrid ViT", 'google-research/vision_transformer vit_jax/'),
    ('wsresnet', 'make', "vit_jax's ResNet stage (StdConv)", 'google-research/vision_transformer vit_jax/'),
    ('wmt', 'make', "Flax's wmt Transformer", 'google/flax examples/wmt/models.py'),
    ('seq2seq', 'make', "Flax's seq2seq", 'google/flax examples/seq2seq/models.py'),
    ('bv', 'make_gap', "big_vision's ViT (gap)", 'google-research/big_vision big_vision/'),
    ('bv', 'make_scan', "big_vision's ViT (scanned, nn.remat)", 'google-research/big_vision big_vision/'),
    ('gemma', 'make', 'gemma', 'google-deepmind/gemma gemma/ (v2.0.8)'),
    ('vivit', 'make', "scenic's ViViT", 'google-research/scenic scenic/ (with DIR/vivit/_shims)'),
]

PUBLIC_FACTORIES = {
    'vae': """
import jax, jax.numpy as jnp
from converters import LinenModel
import models

def make():
  return LinenModel(models.VAE(latents=8), jnp.ones((2, 784)), jax.random.key(0))
""",
    'ppo': """
import jax.numpy as jnp
from converters import LinenModel
import models

def make():
  return LinenModel(models.ActorCritic(num_outputs=4), jnp.ones((2, 32, 32, 4)))
""",
    'nlp_seq': """
import jax.numpy as jnp
from converters import LinenModel
import models

def make():
  config = models.TransformerConfig(vocab_size=50, output_vocab_size=7, emb_dim=16, num_heads=2,
                                    num_layers=2, qkv_dim=16, mlp_dim=32, max_len=32)
  return LinenModel(models.Transformer(config), inputs=jnp.ones((2, 12), jnp.int32), train=False)
""",
    'imagenet': """
import jax.numpy as jnp
from converters import LinenModel
import models

def make():
  return LinenModel(models.ResNet18(num_classes=5, num_filters=8), jnp.ones((2, 32, 32, 3)), train=False)

def make64():
  return LinenModel(models.ResNet18(num_classes=5, num_filters=8), jnp.ones((2, 64, 64, 3)), train=False)
""",
    'dit': """
import jax.numpy as jnp
from converters import LinenModel
import diffusion_transformer as dt

def make():
  model = dt.DiT(patch_size=4, hidden_size=16, depth=2, num_heads=2, mlp_ratio=2.0,
                 class_dropout_prob=0.1, num_classes=5, learn_sigma=False)
  return LinenModel(model, jnp.ones((2, 16, 16, 4)), jnp.array([3.0, 500.0]), jnp.array([1, 4]), train=False)
""",
    'dncnn': """
import jax.numpy as jnp
from converters import LinenModel
from scico.flax._models import DnCNNNet

def make():
  return LinenModel(DnCNNNet(depth=4, channels=1, num_filters=8), jnp.ones((2, 16, 16, 1)), train=False)
""",
    'mixer': """
import types
import jax.numpy as jnp
from converters import LinenModel
from vit_jax import models_mixer

def make():
  model = models_mixer.MlpMixer(patches=types.SimpleNamespace(size=(8, 8)), num_classes=5, num_blocks=2,
                                hidden_dim=16, tokens_mlp_dim=8, channels_mlp_dim=32)
  return LinenModel(model, jnp.ones((2, 32, 32, 3)), train=False)
""",
    'vit': """
import types
import jax.numpy as jnp
from converters import LinenModel
from vit_jax import models_vit

TRANSFORMER = dict(num_layers=2, mlp_dim=32, num_heads=2, dropout_rate=0.0, attention_dropout_rate=0.0)

def make():
  model = models_vit.VisionTransformer(num_classes=5, patches=types.SimpleNamespace(size=(8, 8)),
                                       transformer=TRANSFORMER, hidden_size=16, classifier='token')
  return LinenModel(model, jnp.ones((2, 32, 32, 3)), train=False)

def make_hybrid():
  model = models_vit.VisionTransformer(
      num_classes=5, patches=types.SimpleNamespace(size=(1, 1)), transformer=TRANSFORMER, hidden_size=16,
      classifier='token', resnet=types.SimpleNamespace(num_layers=(1, 1), width_factor=0.5))
  return LinenModel(model, jnp.ones((2, 32, 32, 3)), train=False)
""",
    'wsresnet': """
import jax.numpy as jnp
from converters import LinenModel
from vit_jax import models_resnet

def make():
  return LinenModel(models_resnet.ResNetStage(block_size=2, nout=32, first_stride=(2, 2)), jnp.ones((2, 16, 16, 32)))
""",
    'wmt': """
import jax
from converters import LinenModel
import models

def make():
  config = models.TransformerConfig(vocab_size=40, output_vocab_size=40, emb_dim=16, num_heads=2, num_layers=2,
                                    qkv_dim=16, mlp_dim=32, max_len=32, deterministic=True, decode=False)
  inputs = jax.random.randint(jax.random.key(0), (2, 10), 1, 40).at[1, 7:].set(0)
  targets = jax.random.randint(jax.random.key(1), (2, 9), 1, 40).at[1, 6:].set(0)
  return LinenModel(models.Transformer(config), inputs, targets)
""",
    'seq2seq': """
import jax, jax.numpy as jnp
from converters import LinenModel
import models

def make():
  encoded = jax.nn.one_hot(jnp.array([[3, 4, 5, 1, 0, 0], [2, 6, 1, 0, 0, 0]]), 10)
  decoded = jax.nn.one_hot(jnp.array([[7, 3, 4, 1, 0], [7, 2, 1, 0, 0]]), 10)
  return LinenModel(models.Seq2seq(teacher_force=True, hidden_size=16, vocab_size=10), encoded, decoded)
""",
    'bv': """
import jax.numpy as jnp
from converters import LinenModel
from big_vision.models import vit

def make_gap():
  model = vit.Model(num_classes=5, patch_size=(8, 8), width=16, depth=2, mlp_dim=32, num_heads=2,
                    pool_type='gap', head_zeroinit=False)
  return LinenModel(model, jnp.ones((2, 32, 32, 3)), train=False)

def make_scan():
  model = vit.Model(num_classes=5, patch_size=(8, 8), width=16, depth=2, mlp_dim=32, num_heads=2,
                    pool_type='gap', head_zeroinit=False, scan=True)
  return LinenModel(model, jnp.ones((2, 32, 32, 3)), train=False)
""",
    'gemma': """
import jax, jax.numpy as jnp
from converters import LinenModel
from gemma import modules, transformer

def make():
  config = transformer.TransformerConfig(
      num_layers=2, num_embed=64, embed_dim=16, hidden_dim=32, num_heads=2, head_dim=8, num_kv_heads=1,
      final_logit_softcap=30.0, use_post_attn_norm=True, use_post_ffw_norm=True,
      attention_types=(modules.AttentionType.LOCAL_SLIDING, modules.AttentionType.GLOBAL),
      max_cache_length=16, attn_logits_soft_cap=50.0, sliding_window_size=4)
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 1, 64)
  positions = jnp.broadcast_to(jnp.arange(8), (2, 8))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((8, 8), bool)), (2, 8, 8))
  return LinenModel(transformer.Transformer(config), tokens, positions, None, mask)
""",
    'vivit': """
import jax.numpy as jnp
import ml_collections
from converters import LinenModel
from scenic.projects.vivit import model as vivit_model

def make():
  model = vivit_model.ViViT(
      mlp_dim=32, num_layers=2, num_heads=2, num_classes=5,
      patches=ml_collections.ConfigDict({'size': (4, 4, 2)}), hidden_size=16,
      temporal_encoding_config=ml_collections.ConfigDict(
          {'method': '3d_conv', 'kernel_init_method': 'central_frame_initializer'}),
      attention_config=ml_collections.ConfigDict({'type': 'spacetime'}),
      dropout_rate=0.0, attention_dropout_rate=0.0, classifier='gap')
  return LinenModel(model, jnp.ones((2, 8, 16, 16, 3)), train=False)
""",
}


def _run(factory: str, label: str, scratch: str, cwd: str, env: dict) -> dict | None:
  """One model ported, and its written test run: its row, or None if the
  command gave no report."""
  out = os.path.join(scratch, factory.replace(':', '_').replace('.', '_') + '_nnx.py')
  start = time.perf_counter()
  result = subprocess.run(
      [sys.executable, '-m', 'linen_nnx_cli.main', 'port', factory, '--out', out, '--json',
       '--devices', '2'],
      capture_output=True, text=True, cwd=cwd, env=env, timeout=1800, check=False,
  )
  wall = time.perf_counter() - start
  try:
    # (The model's module may print when imported: the report is the last thing.)
    start_of_report = result.stdout.find('\n{') + 1 if not result.stdout.startswith('{') else 0
    report = json.loads(result.stdout[start_of_report:])
    report['checks']
  except (ValueError, KeyError):
    print(f'{label}: linen-nnx port exited {result.returncode}: {result.stdout}{result.stderr}'[-2000:])
    return None
  checks = {c['check'].split(' (')[0]: c for c in report['checks']}
  others = [c for c in report['checks'] if c['check'].startswith('another configuration')]
  unproven = [c['check'] for c in report['checks'] if c['outcome'] in ('FAILED', 'NOT PROVEN', 'NOT COVERED')]
  branches = report.get('branches') or []
  outcome = ('proven' if report['ok'] else
             f'stubs: {", ".join(s["class"] for s in report["stubs"])}' if report['stubs']
             else 'not proven: ' + '; '.join(unproven) if unproven
             else f'proven but for {len(branches)} branch(es) written to raise' if branches
             else 'not proven')
  # The test file the port wrote, run as the user's CI runs it: the proof
  # again, decoding, and a Linen checkpoint converted by `linen-nnx
  # convert --paths` and trained on (2 simulated devices, as the port ran).
  test_file = os.path.join(scratch, f'test_{os.path.basename(out)[:-3]}_port.py')
  start = time.perf_counter()
  written = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', test_file],
      capture_output=True, text=True, cwd=cwd, timeout=1800, check=False,
      env={**env, 'XLA_FLAGS': '--xla_force_host_platform_device_count=2'},
  )
  test_seconds = time.perf_counter() - start
  test_outcome = (written.stdout.strip().splitlines() or ['?'])[-1].strip('= ')
  seconds = lambda figure: float(figure.split()[0]) if figure and figure[0].isdigit() else 0.0
  return {
      'model': label, 'outcome': outcome, 'wall_s': round(wall, 2),
      'generated': checks.get('generated', {}).get('figure', ''),
      'proof': checks.get('assert_port_equivalent', {}).get('figure', ''),
      'other_configurations': f'{sum(seconds(c["figure"]) for c in others):.2f} s ({len(others)})',
      'written_test_s': round(test_seconds, 1), 'written_test': test_outcome,
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--public', metavar='DIR', help='the public models\' sources, one folder per case')
  parser.add_argument('--only', metavar='TEXT', help='only the models whose label holds TEXT')
  args = parser.parse_args(argv)
  wanted = lambda label: args.only is None or args.only in label
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    with open(os.path.join(scratch, 'bench_factories.py'), 'w') as f:
      f.write(FACTORIES)
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([scratch, ROOT])}
    for factory, label in MODELS:
      if not wanted(label):
        continue
      row = _run(factory, label, scratch, scratch, env)
      if row is None:
        return 1
      rows.append(row)
    if args.public:
      public = os.path.abspath(args.public)
      for case, function, label, origin in PUBLIC:
        if not wanted(label):
          continue
        folder = os.path.join(public, case)
        if not os.path.isdir(folder):
          print(f'{label}: no {folder} (its source: {origin}); skipped')
          continue
        with open(os.path.join(scratch, f'bench_{case}.py'), 'w') as f:
          f.write(PUBLIC_FACTORIES[case])
        paths = [scratch, ROOT, folder, os.path.join(public, '_deps')] + (
            [os.path.join(folder, '_shims')] if os.path.isdir(os.path.join(folder, '_shims')) else [])
        row = _run(f'bench_{case}:{function}', label, scratch, scratch,
                   {**os.environ, 'PYTHONPATH': os.pathsep.join(paths)})
        rows.append(row or {'model': label, 'outcome': 'no report', 'wall_s': 0, 'generated': '',
                            'proof': '', 'other_configurations': '', 'written_test_s': 0, 'written_test': ''})
  if not rows:
    print('no model chosen')
    return 1
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
