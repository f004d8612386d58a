"""Every model-zoo pair converts through the conversion API and the CI helpers, exactly.

For the CNN, the ResNet (with `batch_stats`), the LSTM LM and the transformer
LM (looped and scanned, in each NNX annotation idiom): Linen -> NNX -> Linen
and NNX -> Linen -> NNX are the identity for every collection, eval-mode
outputs and gradients are equal bit for bit (`assert_port_equivalent`), and
k Linen adam steps, a conversion and j NNX steps equal k + j Linen steps
(`assert_training_equivalent`). The transformer's decode cache, converted
after 3 generated tokens, gives the same logits for the next 3 on the NNX side.

The ports that reshaped parameters (the LSTM on NNX's fused-gate
`OptimizedLSTMCell`, the transformer with fused query/key/value and a
flattened out kernel) convert through rules with value transforms
(`Rearrange`), with the same checks.

The path mappings are the zoo's hand-written tables (`model_zoo.paths`); the
conversions are told nothing else about the models. Bit equality holds
because each pair compiles to the same program, or, for the scanned
transformer (two programs), as XLA compiles them by default (under `make
test`'s cheaper options, within the tolerance that says why); the one place
it would not (dropout, whose random streams differ between the frameworks)
is kept out by training deterministically. The reshaping ports compile to
other programs (one fused product where Linen has several), so their outputs
and gradients are compared within tolerances that say why, next to them.
"""

from __future__ import annotations


import jax
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state
from hypothesis import given, strategies as st
from jax.sharding import AxisType

import converters
from converters import LinenModel
from converters.comparison import LeafRelative
from converters.errors import PathMappingError
from converters.testing import assert_port_equivalent, assert_training_equivalent
from model_zoo import paths as zoo_paths
from model_zoo.configs import RULES, CNNConfig, ResNetConfig, RNNConfig, TransformerConfig
from model_zoo.linen import cnn as linen_cnn
from model_zoo.linen import resnet as linen_resnet
from model_zoo.linen import rnn as linen_rnn
from model_zoo.linen import transformer as linen_tf
from model_zoo.nnx import cnn as nnx_cnn
from model_zoo.nnx import resnet as nnx_resnet
from model_zoo.nnx import rnn as nnx_rnn
from model_zoo.nnx import transformer as nnx_tf
from tests import compile_options, helpers
from tests.converters.checkpoint.zoo_models import mapping
from tests.hypothesis_profiles import compiling
from tests.model_zoo import strategies
from tests.helpers import mesh

TX = optax.adam(1e-2)


def in_mesh(rules=RULES):
  return helpers.in_mesh(rules)


def image_batch(config, batch: int, seed: int):
  size = config.image_size if hasattr(config, 'image_size') else 8
  images = jax.random.normal(jax.random.key(seed), (batch, size, size, config.in_channels))
  labels = jax.random.randint(jax.random.key(seed + 1), (batch,), 0, config.num_classes)
  return {'image': images, 'label': labels}


def tokens(config, batch: int, length: int, seed: int):
  return jax.random.randint(jax.random.key(seed), (batch, length), 0, config.vocab_size)


# -- CNN: no annotations, dropout ----------------------------------------------------


def cnn_case(config: CNNConfig):
  x = image_batch(config, 2, 0)['image']
  variables = linen_cnn.CNN(config).init(jax.random.key(0), x, train=False)
  return variables, nnx_cnn.CNN(config, rngs=nnx.Rngs(1)), x


def classification_loss(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@pytest.mark.nightly  # CI: test_cnn_trains_on_in_nnx_exactly, test_models [cnn]
def test_cnn_port_is_equivalent():
  config = CNNConfig()
  variables, model, x = cnn_case(config)
  assert_port_equivalent(
      linen_cnn.CNN(config), variables, model, x, paths=mapping(zoo_paths.CNN),
      linen_kwargs={'train': False},
  )


def test_cnn_trains_on_in_nnx_exactly():
  config = CNNConfig()
  variables, model, _ = cnn_case(config)
  state = train_state.TrainState.create(apply_fn=linen_cnn.CNN(config).apply, params=variables['params'], tx=TX)

  @jax.jit
  def linen_step(state, batch):  # deterministic: dropout streams differ by framework
    grad = jax.grad(lambda p: classification_loss(state.apply_fn({'params': p}, batch['image'], train=False), batch['label']))
    return state.apply_gradients(grads=grad(state.params))

  @nnx.jit
  def nnx_step(model, optimizer, batch):
    model.eval()
    grads = nnx.grad(lambda m: classification_loss(m(batch['image']), batch['label']))(model)
    optimizer.update(model, grads)

  batches = [image_batch(config, 4, 10 + i) for i in range(4)]
  target = (model, nnx.Optimizer(model, TX, wrt=nnx.Param))
  # The mapping inferred (the hand-written one serves the other zoo models).
  linen = LinenModel(linen_cnn.CNN(config), batches[0]['image'], train=False)
  assert_training_equivalent(
      state, linen_step, target, nnx_step, batches, k=2, paths='infer', linen_model=linen
  )
  with pytest.raises(PathMappingError, match=r'pass linen_model=LinenModel\(module'):
    assert_training_equivalent(state, linen_step, target, nnx_step, batches, k=2, paths='infer')


# -- ResNet: batch_stats, a TrainState subclass ------------------------------------------


def resnet_case(config: ResNetConfig):
  batch = image_batch(config, 4, 0)
  linen = linen_resnet.ResNet(config)
  variables = linen.init(jax.random.key(0), batch['image'], train=False)
  # One train-mode call, so the running statistics are not their initial values.
  _, updates = linen.apply(variables, batch['image'], train=True, mutable=['batch_stats'])
  return {**variables, **updates}, nnx_resnet.ResNet(config, rngs=nnx.Rngs(1)), batch


# Nightly; CI: test_resnet_train_state_with_batch_stats_trains_on_in_nnx_exactly (batch_stats and
# moments converted, train-mode steps bit for bit), model_zoo/test_resnet.py::test_eval_logits_are_bit_identical.
@pytest.mark.nightly
@pytest.mark.parametrize('stage_sizes', [(1, 1), (2,)])
def test_resnet_port_is_equivalent(stage_sizes):
  config = ResNetConfig(stage_sizes=stage_sizes)
  variables, model, batch = resnet_case(config)
  assert_port_equivalent(
      linen_resnet.ResNet(config), variables, model, batch['image'],
      paths=mapping(zoo_paths.RESNET), linen_kwargs={'train': False},
  )


# k=2 first (CI's case): the moments converted are not zero.
@pytest.mark.parametrize('k', [2, 0])
def test_resnet_train_state_with_batch_stats_trains_on_in_nnx_exactly(k):
  config = ResNetConfig()
  variables, model, _ = resnet_case(config)
  state = linen_resnet.TrainState.create(
      apply_fn=linen_resnet.ResNet(config).apply, params=variables['params'], tx=TX,
      batch_stats=variables['batch_stats'],
  )
  batches = [image_batch(config, 4, 20 + i) for i in range(3)]
  assert_training_equivalent(
      state, jax.jit(linen_resnet.train_step), (model, nnx.Optimizer(model, TX, wrt=nnx.Param)),
      nnx.jit(nnx_resnet.train_step), batches, k=k, paths=mapping(zoo_paths.RESNET),
  )


# -- LSTM LM: NNX's RNN keeps RNG state Linen lacks ------------------------------------------


# Nightly; CI: the same nnx.RNN and its rngs converted onto the target both ways with the fused
# gates (test_lstm_trains_on_in_the_fused_cell_exactly[2], below), a target keeping its own RNG state
# (test_variable_types.py::test_a_target_keeps_its_own_rng_state), the plain table's logits
# (model_zoo/test_rnn.py::test_logits_are_bit_identical)
@pytest.mark.nightly
def test_lstm_port_is_equivalent_and_its_rng_state_stays_the_targets():
  config = RNNConfig()
  x = tokens(config, 2, 5, 0)
  variables = linen_rnn.RNNLM(config).init(jax.random.key(0), x)
  model = nnx_rnn.RNNLM(config, rngs=nnx.Rngs(1))
  assert nnx.state(model, nnx.RngState)  # the policy is tested, not vacuous
  assert_port_equivalent(linen_rnn.RNNLM(config), variables, model, x, paths=mapping(zoo_paths.RNN))


# NNX's fused cell is another program: one (in, 4 * hidden) product for the
# four gates where Linen has four, and in the backward pass one contraction
# where Linen adds four. XLA may sum them in another order (the default
# configuration's forward pass is bit-identical, as the zoo's own test shows;
# width 4 is not), so outputs and gradients differ by float32 rounding: a few
# ulps of values of order one (up to 1.2e-7 seen). Adam divides each step by
# the root of its second moment, so for gradient entries near zero the
# rounding moves the step by a share of the learning rate (1e-2): up to about
# 1e-6 on the parameters after 3 steps.
FUSED_CELL_ATOL = 1e-6
FUSED_CELL_TRAINING_ATOL = 1e-5


# Nightly; CI: test_lstm_trains_on_in_the_fused_cell_exactly[2] converts the state both ways
# through the fused rules and compares the steps after it, and
# model_zoo/test_rnn.py::test_the_port_to_nnx_optimized_cell_computes_the_same_logits checks the
# forward pass bit for bit.
@pytest.mark.nightly
def test_lstm_port_to_the_fused_gates_of_nnx_optimized_cell_is_equivalent():
  """Flax's own fused port: Linen's eight gate kernels, NNX's `dense_i`/`dense_h`."""
  config = RNNConfig()
  x = tokens(config, 2, 5, 0)
  variables = linen_rnn.RNNLM(config).init(jax.random.key(0), x)
  model = nnx_rnn.RNNLM(config, cell='optimized_lstm', rngs=nnx.Rngs(1))
  assert model.rnn.cell.dense_i.kernel.shape == (config.embed_dim, 4 * config.hidden)
  assert_port_equivalent(
      linen_rnn.RNNLM(config), variables, model, x, paths=mapping(zoo_paths.RNN_OPTIMIZED_CELL),
      atol=FUSED_CELL_ATOL,
  )


# k=2 first (CI's case): the moments converted are not zero.
@pytest.mark.parametrize('k', [2, 0])
def test_lstm_trains_on_in_the_fused_cell_exactly(k):
  config = RNNConfig()
  x = tokens(config, 2, 5, 0)
  linen = linen_rnn.RNNLM(config)
  variables = linen.init(jax.random.key(0), x)
  model = nnx_rnn.RNNLM(config, cell='optimized_lstm', rngs=nnx.Rngs(1))

  def lm_loss(logits, batch):
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], batch[:, 1:]).mean()

  @jax.jit
  def linen_step(state, batch):
    grads = jax.grad(lambda p: lm_loss(state.apply_fn({'params': p}, batch), batch))(state.params)
    return state.apply_gradients(grads=grads)

  @nnx.jit
  def nnx_step(model, optimizer, batch):
    optimizer.update(model, nnx.grad(lambda m: lm_loss(m(batch), batch))(model))

  state = train_state.TrainState.create(apply_fn=linen.apply, params=variables['params'], tx=TX)
  batches = [tokens(config, 2, 6, 40 + i) for i in range(3)]
  assert_training_equivalent(
      state, linen_step, (model, nnx.Optimizer(model, TX, wrt=nnx.Param)), nnx_step, batches,
      k=k, paths=mapping(zoo_paths.RNN_OPTIMIZED_CELL), atol=FUSED_CELL_TRAINING_ATOL,
  )


# -- transformer: logical rules, three NNX idioms, scan + remat, decode cache -------------


CASES = [(scan, idiom) for scan in (False, True) for idiom in nnx_tf.IDIOMS]
CASE_IDS = [f"{'scan' if s else 'loop'}-{i}" for s, i in CASES]


def transformer_case(
    config: TransformerConfig, idiom: str, decode: bool = False, attention: str = 'multi_head'
):
  with in_mesh():
    x = tokens(config, 2, config.max_len if decode else 8, 0)
    linen = linen_tf.TransformerLM(config, decode=decode)
    # Created in their shards, as Flax's examples do (the converters never reshard).
    abstract = jax.eval_shape(linen.init, jax.random.key(0), x)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh(), RULES)
    variables = jax.jit(linen.init, out_shardings=shardings)(jax.random.key(0), x)
    model = nnx_tf.TransformerLM(config, idiom=idiom, attention=attention, rngs=nnx.Rngs(1))
  return linen, variables, model, x


def transformer_table(config: TransformerConfig, attention: str) -> dict:
  if attention == 'fused_qkv':
    return zoo_paths.transformer_fused_attention(config.num_heads)
  return zoo_paths.TRANSFORMER


# The port with fused attention is another program: one (E, 3E) product for
# query, key and value where Linen has three (E, H, D) products, and in the
# backward pass one contraction where Linen adds three. XLA may sum them in
# another order (the default configuration's forward pass and decoding are
# bit-identical; width 8 with one head is not), so outputs and gradients differ
# by float32 rounding: a few ulps of values of order 1 to 10 (up to 2e-6 seen).
# As for the LSTM's fused cell, adam's division by the root of the second
# moment lets that move a step by a share of the learning rate for gradient
# entries near zero.
FUSED_ATTENTION_ATOL = 1e-5
FUSED_ATTENTION_TRAINING_ATOL = 1e-5


# Nightly; CI: fused q/k/v converted with values and sharding (test_transforms), the fused port's
# logits (model_zoo), the LSTM's fused gates converted both ways and trained on within a tolerance
# (test_lstm_trains_on_in_the_fused_cell_exactly[2], above)
@pytest.mark.nightly
@pytest.mark.parametrize('scan, idiom', CASES, ids=CASE_IDS)
def test_transformer_port_with_fused_attention_is_equivalent(scan, idiom):
  config = TransformerConfig(scan_layers=scan)
  linen, variables, model, x = transformer_case(config, idiom, attention='fused_qkv')
  with in_mesh():
    assert_port_equivalent(
        linen, variables, model, x, paths=mapping(transformer_table(config, 'fused_qkv')),
        atol=FUSED_ATTENTION_ATOL,
    )


# Linen's `nn.scan` and NNX's `nnx.scan` make two programs. Compiled with
# XLA's defaults, as users compile and `make nightly` runs, their outputs and
# gradients are bit-identical; with both of `make test`'s cheaper options
# (tests/compile_options.py; either alone keeps the bits), about half the
# entries of the scanned `mlp.up.kernel`'s gradient round apart, by up to
# 8.9e-8 (1.5 ulps of that leaf's largest value), in every idiom. The
# outputs and the looped blocks stay bit-identical.
SCANNED_GRADIENTS_ATOL = LeafRelative(2 * np.finfo(np.float32).eps)


# CI: the scanned blocks (under remat) in one idiom; the looped ones' tables are converted in CI by
# test_a_decode_cache_converted_after_three_tokens_decodes_the_next_three_alike, and their logits
# compared in every idiom by model_zoo/test_transformer.py::test_eval_logits_are_bit_identical.
@pytest.mark.parametrize('scan, idiom', [
    case if case == (True, 'rules_metadata') else pytest.param(*case, marks=pytest.mark.nightly) for case in CASES
], ids=CASE_IDS)
def test_transformer_port_is_equivalent(scan, idiom):
  config = TransformerConfig(scan_layers=scan)
  linen, variables, model, x = transformer_case(config, idiom)
  with in_mesh():
    atol = SCANNED_GRADIENTS_ATOL if scan and compile_options.all_cheap() else 0.0
    assert_port_equivalent(linen, variables, model, x, paths=mapping(zoo_paths.TRANSFORMER), atol=atol)


# Training adds the optimizer's update to what the equivalence tests above
# check in every idiom and layout: each idiom, layout and attention is trained
# at least once, and every idiom in both layouts but one.
TRAINING_CASES = [
    (False, 'rules_metadata', 'multi_head'),
    (True, 'context_rules', 'multi_head'),
    (False, 'mesh_axes', 'multi_head'),
    (True, 'mesh_axes', 'fused_qkv'),
    (True, 'rules_metadata', 'fused_qkv'),
]


# Nightly; CI: the transformer's gradients (test_transformer_port_is_equivalent), its adam state
# converted (test_models), the CNN, ResNet and LSTM trained on (below)
@pytest.mark.nightly
@pytest.mark.parametrize(
    'scan, idiom, attention', TRAINING_CASES,
    ids=[f"{'scan' if s else 'loop'}-{i}-{a}" for s, i, a in TRAINING_CASES],
)
def test_transformer_trains_on_in_nnx_exactly(scan, idiom, attention):
  config = TransformerConfig(scan_layers=scan)
  linen, variables, model, _ = transformer_case(config, idiom, attention=attention)
  atol = FUSED_ATTENTION_TRAINING_ATOL if attention == 'fused_qkv' else 0.0

  def lm_loss(logits, batch):
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], batch[:, 1:]).mean()

  @jax.jit
  def linen_step(state, batch):
    grads = jax.grad(lambda p: lm_loss(state.apply_fn({'params': p}, batch), batch))(state.params)
    return state.apply_gradients(grads=grads)

  @nnx.jit
  def nnx_step(model, optimizer, batch):
    model.eval()  # deterministic, as the Linen step
    optimizer.update(model, nnx.grad(lambda m: lm_loss(m(batch), batch))(model))

  with in_mesh():
    state = train_state.TrainState.create(apply_fn=linen.apply, params=variables['params'], tx=TX)
    target = (model, nnx.Optimizer(model, TX, wrt=nnx.Param))
    batches = [tokens(config, 2, 8, 30 + i) for i in range(3)]
    assert_training_equivalent(
        state, linen_step, target, nnx_step, batches, k=1,
        paths=mapping(transformer_table(config, attention)), atol=atol,
    )


# Each idiom in both layouts, the two attentions alternating, so that each
# idiom and each layout decodes with both.
DECODE_CASES = [
    (scan, idiom, nnx_tf.ATTENTIONS[i % len(nnx_tf.ATTENTIONS)])
    for i, (scan, idiom) in enumerate(CASES)
]


@pytest.mark.parametrize(
    'scan, idiom, attention', DECODE_CASES,
    ids=[f"{'scan' if s else 'loop'}-{i}-{a}" for s, i, a in DECODE_CASES],
)
def test_a_decode_cache_converted_after_three_tokens_decodes_the_next_three_alike(scan, idiom, attention):
  config = TransformerConfig(scan_layers=scan)
  linen, variables, model, prompt = transformer_case(config, idiom, decode=True, attention=attention)
  table = transformer_table(config, attention)
  decode = jax.jit(lambda v, t: linen.apply(v, t, mutable=['cache']))
  with in_mesh():
    cache = variables['cache']
    for i in range(3):
      _, updates = decode({'params': variables['params'], 'cache': cache}, prompt[:, i:i + 1])
      cache = updates['cache']
    model.init_cache(prompt.shape[0])
    model = converters.linen_to_nnx(
        {'params': variables['params'], 'cache': cache}, target=model, paths=mapping(table),
    )
    model.eval()
    graphdef, state = nnx.split(model)

    @jax.jit
    def nnx_decode(state, token):
      model = nnx.merge(graphdef, state)
      logits = model(token, decode=True)
      return logits, nnx.state(model)

    for i in range(3, 6):
      linen_logits, updates = decode({'params': variables['params'], 'cache': cache}, prompt[:, i:i + 1])
      cache = updates['cache']
      nnx_logits, state = nnx_decode(state, prompt[:, i:i + 1])
      np.testing.assert_array_equal(np.asarray(nnx_logits), np.asarray(linen_logits), err_msg=f'token {i}')


# -- random configurations ------------------------------------------------------------


@pytest.mark.nightly  # CI: the fixed configuration above
@compiling
@given(
    config=strategies.transformer_configs(), idiom=st.sampled_from(nnx_tf.IDIOMS),
    attention=st.sampled_from(nnx_tf.ATTENTIONS),
)
def test_random_transformer_ports_are_equivalent(config, idiom, attention):
  linen, variables, model, x = transformer_case(config, idiom, attention=attention)
  atol = FUSED_ATTENTION_ATOL if attention == 'fused_qkv' else 0.0
  with in_mesh():
    assert_port_equivalent(
        linen, variables, model, x, paths=mapping(transformer_table(config, attention)), atol=atol
    )


@pytest.mark.nightly  # CI: the fixed configuration above
@compiling
@given(config=strategies.resnet_configs())
def test_random_resnet_ports_are_equivalent(config):
  variables, model, batch = resnet_case(config)
  assert_port_equivalent(
      linen_resnet.ResNet(config), variables, model, batch['image'],
      paths=mapping(zoo_paths.RESNET), linen_kwargs={'train': False},
  )


@pytest.mark.nightly  # CI: test_cnn_trains_on_in_nnx_exactly
@compiling
@given(config=strategies.cnn_configs())
def test_random_cnn_ports_are_equivalent(config):
  variables, model, x = cnn_case(config)
  assert_port_equivalent(
      linen_cnn.CNN(config), variables, model, x, paths=mapping(zoo_paths.CNN),
      linen_kwargs={'train': False},
  )


@pytest.mark.nightly  # CI: the fixed configuration above
@compiling
@given(config=strategies.rnn_configs(), cell=st.sampled_from(tuple(nnx_rnn.CELLS)))
def test_random_lstm_ports_are_equivalent(config, cell):
  x = tokens(config, 2, 4, 0)
  variables = linen_rnn.RNNLM(config).init(jax.random.key(0), x)
  model = nnx_rnn.RNNLM(config, cell=cell, rngs=nnx.Rngs(1))
  table, atol = (
      (zoo_paths.RNN_OPTIMIZED_CELL, FUSED_CELL_ATOL) if cell == 'optimized_lstm'
      else (zoo_paths.RNN, 0.0)
  )
  assert_port_equivalent(linen_rnn.RNNLM(config), variables, model, x, paths=mapping(table), atol=atol)


# Nightly only: `test_transformer_port_is_equivalent` covers the transformer
# in CI, on the (2, 4) mesh and the zoo's rules.
@pytest.mark.nightly
@compiling
@given(
    data=st.data(),
    mesh_shape=st.sampled_from(strategies.MESH_SHAPES),
    rules=st.sampled_from(list(strategies.RULE_SETS)),
)
def test_random_transformer_ports_on_other_meshes_and_rule_sets_are_equivalent(data, mesh_shape, rules):
  """The port that reads its rules from the context, on every mesh shape of 8 devices."""
  config = data.draw(strategies.transformer_configs(multiple=max(mesh_shape)))
  rule_set = strategies.RULE_SETS[rules]
  other = jax.make_mesh(mesh_shape, ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
  with jax.set_mesh(other), nn.logical_axis_rules(rule_set), nnx.logical_axis_rules(rule_set):
    x = tokens(config, 2, 8, 0)
    linen = linen_tf.TransformerLM(config)
    abstract = jax.eval_shape(linen.init, jax.random.key(0), x)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), other, rule_set)
    variables = jax.jit(linen.init, out_shardings=shardings)(jax.random.key(0), x)
    model = nnx_tf.TransformerLM(config, idiom='context_rules', rngs=nnx.Rngs(1))
    assert_port_equivalent(linen, variables, model, x, paths=mapping(zoo_paths.TRANSFORMER))