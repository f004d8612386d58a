"""`converters.port.port`: the NNX file written, proven, and its test.

Every port is proven by outputs (`assert_generated_port`), at the traced
configuration and at another one (other widths, depths, tuple lengths):
sizes written as the traced numbers would fail the second. The tests marked
`nightly` prove the same files at a third configuration chosen here and run
the test file each port writes (a proof again: too slow for every CI run;
`test_the_written_test_runs_without_the_port_extra` runs one in CI).

Most ports are pinned instead (`PINNED`): CI writes each and compares it,
as text, with the port a nightly run proved (`pinned/`,
`test_the_pinned_ports_are_proven`), the way the golden cases are kept; what
is written is then what was proven, and CI pays for writing, not proving.
`UPDATE_GOLDEN=1` rewrites the pinned files; review their diff before
committing it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import os
import pathlib
import sys
import types
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from converters import LinenModel
from converters.errors import AnnotationError
from converters.port import assert_generated_port, import_file, port, port_paths
from converters.port import prove
from converters.port.prove import paths_file
from converters.port.emit import ruff_check
from model_zoo import configs
from model_zoo.linen import cnn
from tests.converters.port import linen_models
from tests.converters.port.golden import refused_flag_branch as golden_refused
from tests.converters.port.golden_files import assert_same_text

FACTORIES = 'tests.converters.port.linen_models'
PINS = pathlib.Path(__file__).parent / 'pinned'


def _port(tmp_path, name: str, model: LinenModel):
  out = tmp_path / f'{name}_nnx.py'
  test_out = tmp_path / f'test_{name}_nnx_port.py'
  result = port(model, str(out), factory=f'{FACTORIES}:{name}', test_out=str(test_out))
  return result, out, test_out


def _written(tmp_path, name: str, model: LinenModel):
  """The file `port` writes for `model`, without its proofs: for tests of
  what is written, where another test proves the same code."""
  from converters.port import generate

  result, _ = generate.write(model, factory=f'{FACTORIES}:{name}', module_name=f'{name}_nnx')
  out = tmp_path / f'{name}_nnx.py'
  out.write_text(result.text)
  pathlib.Path(paths_file(str(out))).write_text(result.paths_text)
  ruff_check(str(out))  # its safe fixes, as `port` makes them
  return result, out


@dataclasses.dataclass(frozen=True)
class Pinned:
  """A port whose text CI compares with `pinned/` and nightly proves.

  Attributes:
    model: the Linen model it ports.
    reported: checks the proof must report, with their outcome (beside
      `proven`, which holds only where every check passed).
    also: other configurations the written port is proven at too.
  """

  model: Callable[[], LinenModel]
  reported: Mapping[str, str] = dataclasses.field(default_factory=dict)
  also: tuple[Callable[[], LinenModel], ...] = ()


def _passed(*checks: str) -> dict[str, str]:
  return dict.fromkeys(checks, 'passed')


PINNED = {
    'awkward': Pinned(linen_models.awkward),
    'batch_normed': Pinned(linen_models.batch_normed),
    'channels_first': Pinned(linen_models.channels_first, also=(lambda: linen_models.channels_first(size=7),)),
    'embedding_handed_on_twice': Pinned(linen_models.embedding_handed_on_twice),
    'embedding_made_in_place': Pinned(linen_models.embedding_made_in_place),
    'embedding_named_by_a_local': Pinned(linen_models.embedding_named_by_a_local),
    'flag_named_as_a_mode': Pinned(
        linen_models.flag_named_as_a_mode,
        _passed('another configuration (deterministic=False, a flag of the call)')),
    'float_fields': Pinned(linen_models.float_fields,
                           _passed('another configuration (scale=0.75, epsilon=2e-06)')),
    'hands_on_modes': Pinned(linen_models.hands_on_modes),
    'initialized_in_place': Pinned(linen_models.initialized_in_place, _passed('ruff check')),
    'layer_from_partial_field': Pinned(linen_models.layer_from_partial_field),
    'loop_between_layers': Pinned(linen_models.loop_between_layers, _passed('another configuration (widths=())')),
    'lora': Pinned(linen_models.lora),
    'merged_flag': Pinned(linen_models.merged_flag, _passed('another configuration (plain=False, a flag of the call)')),
    'named_counters': Pinned(linen_models.named_counters),
    'noisy_embedder': Pinned(linen_models.noisy_embedder,
                             _passed('another configuration (train=True, a flag of the call)')),
    'normed_rms': Pinned(linen_models.normed_rms),
    'norms_none_together': Pinned(linen_models.norms_none_together),
    'one_list_two_layers': Pinned(linen_models.one_list_two_layers),
    'patchify': Pinned(linen_models.patchify, _passed(
        'another configuration (patches.size=(5, 5), hidden=9, input 0 (2, 16, 16, 3) -> (2, 16, 16, 4))')),
    'positions_of_the_inputs_dtype': Pinned(
        linen_models.positions_of_the_inputs_dtype,
        {'PositionsOfTheInputsDtype(inputs_dtype=...)': 'jnp.float32 unless given'}),
    'residual_denoiser': Pinned(
        linen_models.residual_denoiser,
        {'assumed of the inputs (the code ties them)': 'x.shape[-1] == self.channels',
         'another configuration (channels=2, features=5, depth=4, input 0 (2, 8, 8, 1) -> (2, 8, 8, 2))': 'passed'}),
    'scaled': Pinned(linen_models.scaled),
    'scanned_or_looped': Pinned(linen_models.scanned_or_looped,
                                also=(lambda: linen_models.scanned_or_looped(scan=True),)),
    'shared_embedding': Pinned(linen_models.shared_embedding),
    'stack': Pinned(linen_models.stack),
    'sows_a_loss': Pinned(linen_models.sows_a_loss),
    'tiled_by': Pinned(linen_models.tiled_by),
    'two_pools': Pinned(linen_models.two_pools),
}


def _pinned(tmp_path, name: str):
  """The file `port` writes for `PINNED[name]`, without its proofs,
  checked to be the text a nightly run proved (`pinned/`)."""
  result, out = _written(tmp_path, name, PINNED[name].model())
  assert_same_text(PINS, {f'{name}_nnx.py': out.read_text(), f'{name}_nnx_paths.py': result.paths_text})
  return result, out


def test_the_pinned_files_are_those_of_PINNED():
  pinned = {p.name.removesuffix('_nnx.py') for p in PINS.glob('*_nnx.py')}
  assert pinned == set(PINNED), 'run the tests that pin them with UPDATE_GOLDEN=1, or remove the stale files'
  assert {p.name for p in PINS.glob('*_nnx_paths.py')} == {f'{name}_nnx_paths.py' for name in PINNED}


@pytest.mark.nightly
@pytest.mark.parametrize('name', sorted(PINNED))
def test_the_pinned_ports_are_proven(tmp_path, name):
  pinned = PINNED[name]
  out = tmp_path / f'{name}_nnx.py'
  result = port(pinned.model(), str(out), factory=f'{FACTORIES}:{name}')  # no test file: as `_written` writes it
  assert result.proven, (result.failure, result.checks)
  assert out.read_text() == (PINS / f'{name}_nnx.py').read_text(), 'the proven port is not the pinned text'
  assert result.paths_text == (PINS / f'{name}_nnx_paths.py').read_text()
  for check, outcome in pinned.reported.items():
    assert _outcome(result, check) == outcome, result.checks
  for other in pinned.also:
    assert_generated_port(other(), import_file(str(out)), modes=result.modes)


def _edited(out, path, text: str):
  """The port at `out` written to `path` as `text` (a planted bug), its
  mapping copied beside it as it was written."""
  path.write_text(text)
  pathlib.Path(paths_file(str(path))).write_text(pathlib.Path(paths_file(str(out))).read_text())
  return path


def _outcome(result, check: str) -> str:
  """What the report says of `check` (`'passed'`, `'FAILED'`, ...)."""
  return {name: outcome for name, outcome, _ in result.checks}[check]


def _run_written_test(test_out, tmp_path):
  """Every test of the file a port writes, as pytest would run them."""
  spec = importlib.util.spec_from_file_location(f'written_{os.path.basename(test_out)[:-3]}', test_out)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  tests = [name for name in vars(module) if name.startswith('test_')]
  assert tests
  for name in tests:
    function = getattr(module, name)
    if 'tmp_path' in function.__code__.co_varnames[:function.__code__.co_argcount]:
      directory = tmp_path / name
      directory.mkdir()
      function(directory)
    else:
      function()


THIRD_CONFIGURATIONS = [
    ('stack', lambda: linen_models.stack(widths=(3, 4, 6), features=7)),
    ('tower', lambda: linen_models.tower(width=9, hidden=4, depth=3)),
    ('scaled', lambda: linen_models.scaled(features=6)),
    ('counts', lambda: linen_models.counts(features=5)),
    ('setup_stack', lambda: linen_models.setup_stack(num_heads=5, head_dim=2, width=7)),
]


# The tower, the setup() stack and the stack run nightly only: the
# third-configuration test below proves them at the same configurations and
# one more (CI checks the stack's text, and proves loops of layers in the
# random programs and the zoo).
@pytest.mark.parametrize('name', [
    pytest.param(name, marks=pytest.mark.nightly) if name in ('tower', 'setup_stack', 'stack') else name
    for name, _ in THIRD_CONFIGURATIONS
])
def test_ports_are_proven_at_the_traced_and_another_configuration(tmp_path, name):
  result, out, _ = _port(tmp_path, name, getattr(linen_models, name)())
  assert result.proven, (result.failure, result.checks)
  assert not result.stubs
  assert [check for check, *_ in result.checks if check.startswith('another configuration')]
  assert ruff_check(str(out)) == ([], [])


@pytest.mark.nightly
@pytest.mark.parametrize('name, other', THIRD_CONFIGURATIONS)
def test_ports_hold_at_a_third_configuration_and_pass_their_written_test(tmp_path, name, other):
  result, out, test_out = _port(tmp_path, name, getattr(linen_models, name)())
  assert result.proven, (result.failure, result.checks)
  _run_written_test(test_out, tmp_path)
  assert_generated_port(other(), import_file(str(out)), modes=result.modes)


def test_the_kit_writes_loops_and_names_as_a_person_would(tmp_path):
  result, out = _pinned(tmp_path, 'stack')
  text = out.read_text()
  assert 'def __init__(self, config: StackConfig, *, in_features: int, rngs: nnx.Rngs):' in text
  assert 'for dense in self.denses:' in text
  assert 'x = dense(x)  # the input size comes from the previous layer' in text  # comments kept
  # After the loop, the size the loop left: any number of widths.
  assert 'self.norm = nnx.LayerNorm(in_features, rngs=rngs)' in text
  assert "PathRule('Dense_{i}/kernel', 'denses/{i}/kernel')" in result.paths_text
  # `train` only set the dropout's mode: NNX's model.train() / .eval() does.
  assert result.modes == {'train': True}
  assert 'def __call__(self, x: jax.Array) -> jax.Array:' in text


def test_own_variables_are_nnx_variables_read_the_nnx_way(tmp_path):
  _, out = _pinned(tmp_path, 'scaled')
  text = out.read_text()
  assert 'self.scale = nnx.Param(nnx.initializers.ones(rngs.params(), (in_features,)))' in text
  assert 'scale = self.scale[...]' in text
  # (`counts` is proven by `test_ports_are_proven_at_the_traced_and_another_configuration`.)
  _, out = _written(tmp_path, 'counts', linen_models.counts())
  text = out.read_text()
  assert 'self.total = nnx.BatchStat(jnp.zeros((in_features,)))' in text
  assert 'total[...] = total[...] + x.sum(0)' in text
  assert "self.sow(nnx.Intermediate, 'seen', total[...])" in text


def test_setup_modules_keep_their_attributes_and_lists_become_nnx_lists(tmp_path):
  # Written here; proven at three configurations nightly (THIRD_CONFIGURATIONS).
  result, out = _written(tmp_path, 'setup_stack', linen_models.setup_stack())
  text = out.read_text()
  assert '# NNX keeps these attribute names; a list becomes an nnx.List.' in text
  assert 'self.heads = nnx.List([nnx.Linear(in_features, head_dim, rngs=rngs) for _ in range(num_heads)])' in text
  assert 'self.norm = nnx.LayerNorm(head_dim * num_heads, rngs=rngs)' in text
  assert 'return self.head(x) + self.bias[...]' in text
  assert 'x = self.dropout(self.norm(x))' in text and 'def __call__(self, x):' in text
  assert 'def first_head(self, x):' in text
  assert "PathRule('heads_{i}/kernel', 'heads/{i}/kernel')" in result.paths_text
  assert result.modes == {'deterministic': False}


def test_fields_that_only_set_modes_become_the_nnx_mode(tmp_path):
  # `train` -> `deterministic=not train` of a block -> its dropouts and a
  # child's field: one mode, set by model.train() / .eval(). (Proven in CI by
  # `linen-nnx port`, `test_port_command.py`'s side-by-side page.)
  result, out = _written(tmp_path, 'modes_by_field', linen_models.modes_by_field())
  assert result.modes == {'train': True}
  text = out.read_text()
  assert 'def __init__(self, features: int, *, in_features: int, rngs: nnx.Rngs):' in text
  assert 'self.inner = Inner(features, in_features=in_features, rngs=rngs)' in text
  assert 'deterministic' not in text.split('class Inner')[1].split('class HandsOnModes')[0]
  # The model's own field: checked in eval mode, Linen at `deterministic=True`.
  result, out = _pinned(tmp_path, 'hands_on_modes')
  assert result.modes == {'deterministic': False}


def test_layers_made_by_the_files_functions_are_written_with_them(tmp_path):
  # Traced with LayerNorm, proven with RMSNorm too: the function is written
  # for every branch, and `name='pre_norm'` names the attribute.
  texts = []
  for kind in ('layer', 'rms'):
    if kind == 'layer':
      _, out = _written(tmp_path, f'normed_{kind}', linen_models.normed_block(kind))
    else:
      _, out = _pinned(tmp_path, f'normed_{kind}')
    texts.append(out.read_text())
  helper = 'def _norm(kind: str, *, num_features: int, rngs: nnx.Rngs) -> nnx.Module:'
  assert helper in texts[0] and helper in texts[1]
  assert 'self.pre_norm = _norm(kind, num_features=in_features, rngs=rngs)' in texts[0]
  assert 'self.dense_1 = _projection(features + 1, in_features=features, rngs=rngs)' in texts[0]
  assert 'flax import linen' not in texts[0]


@pytest.fixture(scope='module')
def written_encoder(tmp_path_factory):
  """The encoder's port, written once for the tests that read it."""
  return _written(tmp_path_factory.mktemp('encoder'), 'encoder', linen_models.encoder())


def test_attention_and_annotations_are_written_as_names(written_encoder):
  # Proven, at the traced configuration and the others, nightly (below); the
  # planted annotations below are refused in CI.
  result, out = written_encoder
  assert not result.stubs
  text = out.read_text()
  # NNX's attention takes its input size by keyword (after num_heads), and
  # Linen's default decode=False, which NNX's attention does not default to.
  assert '        in_features=c.width,\n        decode=False,\n        rngs=rngs,\n    )' in text
  assert "kernel_init=nnx.with_partitioning(nnx.initializers.xavier_uniform(), ('embed', 'kv'))," in text
  assert "nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, 'model'))" in text
  # The residual ties the block's input to the width: no input size asked
  # for, every input size of the block `c.width` but the second Dense's,
  # `c.hidden` (test_shapes' nightly test_an_input_size_the_code_ties_to_a_field_is_that_field).
  assert 'def __init__(self, config: AttentionConfig, *, rngs: nnx.Rngs):' in text
  assert '    self.layer_norm = nnx.LayerNorm(c.width, rngs=rngs)\n' in text
  assert '    self.dense_0 = nnx.Linear(\n        c.width,\n        c.hidden,\n' in text
  assert '    self.dense_1 = nnx.Linear(c.hidden, c.width, use_bias=False, rngs=rngs)\n' in text
  assert 'mask = nnx.make_causal_mask(tokens)' in text
  assert result.modes == {'train': True}


@pytest.mark.nightly
def test_the_encoder_is_proven_at_other_configurations(tmp_path):
  result, _, _ = _port(tmp_path, 'encoder', linen_models.encoder())
  assert result.proven, (result.failure, result.checks)


@pytest.mark.parametrize('edit', [
    pytest.param(("('embed', 'kv')", "('kv', 'embed')"), marks=pytest.mark.nightly),  # other names
    ("        kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, 'model')),\n", ''),  # none
])
def test_a_port_annotated_otherwise_is_not_proven(tmp_path, written_encoder, edit):
  # As written, `test_the_encoder_is_proven_at_other_configurations` proves it.
  result, out = written_encoder
  text = out.read_text()
  assert edit[0] in text
  changed = _edited(out, tmp_path / 'encoder_changed.py', text.replace(edit[0], edit[1]))
  # The conversion refuses it, or the round trips show it: never proven.
  with pytest.raises((AssertionError, AnnotationError), match='annotation'):
    assert_generated_port(linen_models.encoder(), import_file(str(changed)), modes=result.modes)


def test_scanned_layers_are_a_vmapped_stack_run_by_nnx_scan(tmp_path):
  # Traced looped, the flag's other branch traced too: both written, both
  # proven (the third check is at `config.scan=True`), one PATHS for both
  # (nightly, `PINNED`: the scanned layout through the file's own PATHS too).
  result, out = _pinned(tmp_path, 'scanned_or_looped')
  assert [description for _, description, _ in result.flags] == ['config.scan=True']
  text = out.read_text()
  assert '''      @nnx.split_rngs(splits=config.layers)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: 'layers'})
      def create_layers(rngs: nnx.Rngs):
        return ResidualLayer(config, rngs=rngs)
      self.layers = create_layers(rngs)''' in text
  assert '''      @nnx.remat(prevent_cse=False)
      def layers(x, layer):
        return layer(x, scale)

      x, _ = layers(x, self.layers)''' in text
  assert 'for layer in self.layers:' in text  # the looped branch, the same name
  assert "PathRule('ScanCheckpointResidualLayer_0/Dense_0/kernel', 'layers/dense_0/kernel')" in result.paths_text
  assert "PathRule('ResidualLayer_{i}/Dense_0/kernel', 'layers/{i}/dense_0/kernel')" in result.paths_text


def test_the_kits_mlp_is_written_with_its_annotations_and_helpers(tmp_path):
  # Written here; proven looped and scanned, in both annotation styles, nightly (below).
  from kit_mlp.description import ModelDescription
  from linen_impl import model as linen_mlp

  desc = ModelDescription(num_layers=2, depth=8, batch=4, mesh_shape=(2, 4), annotation='logical')
  with jax.set_mesh(desc.make_mesh()):  # its constraints need the mesh
    result, out = _written(tmp_path, 'kit_mlp_logical', LinenModel(linen_mlp.MLP(desc), jnp.ones((4, 8))))
  assert not result.stubs
  assert [description for _, description, _ in result.flags] == ['desc.use_scan=True']
  text = out.read_text()
  assert "PathRule('ScanDotReluDot_0/W2', 'dot_relu_dots/W2')" in result.paths_text
  assert '_annotate_init(desc, axes.w2)(rngs.params(), (desc.depth, in_features), desc.jnp_dtype),' in text
  # Linen's constraint helper kept as it is (it runs in NNX code alike).
  assert 'return nn.with_logical_constraint(x, names, rules=desc.rules)' in text


@pytest.mark.nightly
@pytest.mark.parametrize('annotation', ['device', 'logical'])
def test_the_kits_mlp_is_ported_looped_and_scanned_in_both_annotation_styles(tmp_path, annotation):
  from kit_mlp.description import ModelDescription
  from linen_impl import model as linen_mlp

  desc = ModelDescription(num_layers=2, depth=8, batch=4, mesh_shape=(2, 4), annotation=annotation)
  with jax.set_mesh(desc.make_mesh()):  # its constraints need the mesh
    result, out, _ = _port(tmp_path, f'kit_mlp_{annotation}', LinenModel(linen_mlp.MLP(desc), jnp.ones((4, 8))))
  assert result.proven, (result.failure, result.checks)
  assert any('desc.use_scan=True' in check and outcome == 'passed' for check, outcome, _ in result.checks)


@pytest.mark.nightly  # forty seconds; in CI, the encoder, scan and cache tests cover its parts
def test_zoo_transformer_is_proven_looped_scanned_and_decoding_in_both(tmp_path):
  result, out, test_out = _port(tmp_path, 'zoo_transformer', linen_models.zoo_transformer())
  assert result.proven, (result.failure, result.checks)
  outcomes = {check.split(' (', 1)[-1].rstrip(')'): outcome for check, outcome, _ in result.checks
              if check.startswith('another configuration')}
  assert outcomes['config.scan_layers=True'] == 'passed'
  assert outcomes['decode=True'] == 'passed'
  assert outcomes['decode=True, config.scan_layers=True'] == 'passed'
  assert any(k.startswith('config.vocab_size=128') and v == 'passed' for k, v in outcomes.items())
  text = out.read_text()
  assert 'self.final_norm = _norm(config, num_features=config.width, rngs=rngs)' in text
  assert '      self.cache_index = nnx.Cache(jnp.array(0, jnp.uint32))' in text
  assert 'return embed.attend(x)' in text
  assert 'self.mlp = Mlp(config, in_features=config.width, rngs=rngs)' in text
  assert 'def test_port_decodes_as_linen_does' in test_out.read_text()
  _run_written_test(test_out, tmp_path)


@pytest.mark.nightly  # CI writes these as the goldens `numbered_names` and `untraced_branch`
def test_numbered_names_configuration_modes_and_untraced_branches(tmp_path):
  result, out, _ = _port(tmp_path, 'numbered', linen_models.numbered())
  assert result.proven, (result.failure, result.checks)
  text = out.read_text()
  assert result.modes == {'config.deterministic': False}  # a flag inside the configuration
  assert "PathRule('layer_{i}/kernel', 'layers/{i}/kernel')" in result.paths_text  # name=f'layer_{i}'
  # The branch this configuration skips, its shape from the source (the
  # input's size the constructor takes), and the condition turned round.
  written = '''    if config.bias_init is not None:
      self.bias = nnx.Param(config.bias_init(rngs.params(), (in_features,)))'''
  assert written in text
  # The branch traced with `bias_init` given an initializer, written into
  # PATHS and proven there: a checkpoint of that configuration converts.
  assert "PathRule('bias', 'bias')" in result.paths_text
  assert _outcome(result, 'another configuration (config.bias_init=an initializer)') == 'passed'
  # Where that branch is taken, the same class is written (proven nightly).
  result, out = _written(tmp_path, 'numbered_bias', linen_models.numbered(nn.initializers.ones))
  assert written in out.read_text()


@pytest.mark.nightly
def test_a_branch_written_from_its_source_is_proven_where_it_is_taken(tmp_path):

  result, _, _ = _port(tmp_path, 'numbered_bias', linen_models.numbered(nn.initializers.ones))
  assert result.proven, (result.failure, result.checks)


@pytest.mark.nightly  # half a minute
def test_flax_lm1b_is_written_whole_and_proven_decoding_too(tmp_path):
  result, out, test_out = _port(tmp_path, 'flax_lm1b', linen_models.flax_lm1b())
  assert result.proven, (result.failure, result.checks)
  outcomes = {check: outcome for check, outcome, _ in result.checks}
  assert outcomes['assert_port_equivalent'] == 'passed'
  assert outcomes['another configuration (config.decode=True)'] == 'passed'
  assert [o for c, o in outcomes.items() if c.startswith('another configuration (config.vocab_size')] == ['passed']
  text = out.read_text()
  assert 'self.encoderdecoderblocks = nnx.List()' in text
  assert "PathRule('decoder/encoderdecoderblock_{i}/MlpBlock_0/Dense_0/kernel'," in result.paths_text
  assert '    self.posembed_output.init_cache(input_shape, dtype)\n' in text
  _run_written_test(test_out, tmp_path)


@pytest.mark.nightly
def test_zoo_resnet_port_holds_for_three_stages_of_other_widths(tmp_path):
  from model_zoo.linen import resnet

  config = configs.ResNetConfig()
  result, out, test_out = _port(tmp_path, 'zoo_resnet', linen_models.zoo_resnet())
  assert result.proven, (result.failure, result.checks)
  assert result.modes == {'train': True}
  text = out.read_text()
  # The shortcut, from the sizes, as a person writes it (Linen decides from shapes).
  assert 'if in_features != filters or strides != (1, 1):' in text
  assert 'in_features=in_size' in text and 'in_size = config.num_filters * 2**i' in text
  assert 'self.head = nnx.Linear(in_size, config.num_classes, rngs=rngs)' in text
  _run_written_test(test_out, tmp_path)  # a TrainState with batch_stats, converted and trained on
  other = dataclasses.replace(config, stage_sizes=(2, 1, 2), num_filters=6, in_channels=2)
  model = LinenModel(resnet.ResNet(other), jnp.ones((3, 16, 16, 2)), train=False)
  assert_generated_port(model, import_file(str(out)), modes=result.modes)


@pytest.mark.nightly  # CI: test_a_call_scanned_over_time_is_nnx_scan_over_the_method (nnx.LSTMCell)
def test_zoo_lstm_cell_goes_into_the_nnx_rnn_with_its_gate_renamed(tmp_path):
  # Proven (three configurations and its written test) nightly, below.
  result, out = _written(tmp_path, 'zoo_rnn', linen_models.zoo_rnn())
  assert not result.stubs
  text = out.read_text()
  # The cell, called only inside Linen's scan, takes the size its kernel has.
  assert 'self.rnn = nnx.RNN(nnx.LSTMCell(config.embed_dim, config.hidden, rngs=rngs), rngs=rngs)' in text
  assert "PathRule('LSTMCell_0/if/kernel', 'rnn/cell/if_/kernel')" in result.paths_text


@pytest.mark.nightly
def test_zoo_lstm_port_holds_at_other_sizes_and_lengths(tmp_path):
  from model_zoo.linen import rnn

  _, out, test_out = _port(tmp_path, 'zoo_rnn', linen_models.zoo_rnn())
  _run_written_test(test_out, tmp_path)
  other = configs.RNNConfig(vocab_size=20, embed_dim=6, hidden=9)
  assert_generated_port(LinenModel(rnn.RNNLM(other), jnp.ones((3, 4), jnp.int32)), import_file(str(out)))


def test_zoo_cnn_with_its_input_shape_and_another_configuration(tmp_path):
  # Proven (three configurations and its written test) nightly, below.
  result, out = _written(tmp_path, 'zoo_cnn', linen_models.zoo_cnn())
  assert not result.stubs
  text = out.read_text()
  # Two poolings per entry of `features`: any number of them.
  assert 'x_shape[0] // 2 ** len(config.features) * (x_shape[1] // 2 ** len(config.features))' in text


@pytest.mark.nightly
def test_zoo_cnn_port_holds_for_other_images_and_channels(tmp_path):
  result, out, test_out = _port(tmp_path, 'zoo_cnn', linen_models.zoo_cnn())
  _run_written_test(test_out, tmp_path)
  other = configs.CNNConfig(image_size=16, in_channels=3, features=(5, 6), hidden=7)
  images = jnp.ones((3, 16, 16, 3))
  assert_generated_port(LinenModel(cnn.CNN(other), images, train=False), import_file(str(out)),
                        modes=result.modes)


@pytest.mark.parametrize('name, reason', [
    ('uses_unknown_layer', "Flax's SpectralNorm has no NNX counterpart"),
    ('depends_on_inputs', 'no condition on the configuration and input size agrees with when Linen creates the modules under `if x.shape[-1] > 2`'),
    ('reads_its_mode_field', "the field 'deterministic' sets the layers' modes and does more"),
    pytest.param('kv_by_keyword', 'nnx.MultiHeadAttention is called with inputs_kv= besides the query',
                 marks=pytest.mark.filterwarnings('ignore:The inputs_kv arg:DeprecationWarning')),  # legacy, as users write it
    ('mixed_modes', "modes come from the call (train) and from the configuration"),
    ('two_mode_flags', "modes come from 2 flags (train, update_stats)"),
    ('dotted_mode_arithmetic', 'config.deterministic sets the layers\' modes and does more'),
    # Nightly: refused_flag_branch's golden case and test_only_the_configurations_that_stop_a_class_are_left_out.
    pytest.param('vmap_alone', 'nn.vmap of a module', marks=pytest.mark.nightly),
    ('other_default', "the default of 'layer', nn.Conv, takes other arguments than the Dense"),
    ('norm_from_config', 'self.config.norm(...) makes RMSNorm in the traced configuration only'),
    ('mode_in_field', "the field 'norm' holds a partial fixing use_running_average=True"),
    ('linen_only_argument_in_field', 'with dot_general_cls=, which nnx.Linear does not take'),
    ('partial_default', "the default of 'layer', DENSE_WITHOUT_BIAS, is a partial of a module class"),
    ('attention_from_field', "NNX's nnx.MultiHeadAttention wants decode where Linen has a default"),
    ('positional_partial_field', "the field 'layer' holds a partial with positional arguments"),
    ('half_width', 'changes with the width of x in a way the port cannot write'),
    # Nightly: half_width's reason.
    pytest.param('chunks', 'changes with the width of x in a way the port cannot write', marks=pytest.mark.nightly),
    ('scanned_with_dropout', 'Dropout created in a method Linen scans'),
    ('scanned_params_per_step', 'nn.scan of a method(..., variable_axes=...)'),
    ('uncalled_scan', 'unused decorated with a lifted transform the port does not write'),
    ('dropout_by_field', 'DropoutByField is configured deterministic=False'),
    # The head's width follows `pre`, not `rep` (None where `pre` is False):
    # no `rep if rep is not None else hidden` guessed from the two instances.
    ('two_flagged_heads', 'the input size of Dense changes from one creation to the next'),
    ('widened_over_a_loop', 'is `x.shape[-1] * 2`, `x.shape[-1] * 4` over the iterations of a loop'),
    ('shared_in_a_loop', 'nn.share_scope of modules made in a loop'),
    # Nightly: test_shared_scopes.py::test_what_the_port_cannot_write_so_is_refused_with_its_line (both reasons).
    pytest.param('shared_under_a_condition', 'where some configurations do not share its scope',
                 marks=pytest.mark.nightly),
    pytest.param('shared_attention', "Flax's MultiHeadDotProductAttention, which holds layers of its own",
                 marks=pytest.mark.nightly),
    ('spread_mutated', '*args or **kwargs in the creation of Dense'),
    # Nightly: spread_mutated's reason.
    pytest.param('chosen_by_the_call', '*args or **kwargs in the creation of Dense', marks=pytest.mark.nightly),
    ('remat_chosen_in_an_expression', 'is made by a transform bound outside the method'),
    # Nightly: test_handed.py::test_what_the_port_does_not_write_is_refused_saying_so (the same refusal).
    pytest.param('handed_to_a_function', 'noisy(...) is handed the module and calls module.make_rng(...) in it',
                 marks=pytest.mark.nightly),
    ('chosen_linen_only_argument', "chooses 'dot_general_cls', which nnx.Linear does not take"),
    ('reads_a_submodules_variables', "self.dense.variables is Linen's Module API of a submodule"),
    # Nightly: dotted_mode_arithmetic's reason.
    pytest.param('mode_through_a_local', "config.deterministic sets the layers' modes and does more",
                 marks=pytest.mark.nightly),
])
def test_what_cannot_be_written_is_a_marked_stub_never_a_port(tmp_path, name, reason):
  # Written only: `test_a_port_with_a_stub_is_never_reported_proven` runs `port` on one.
  result, out = _written(tmp_path, name, getattr(linen_models, name)())
  (stub,) = result.stubs
  assert reason in stub.reason and stub.line is not None
  generated = import_file(str(out))
  stub_class = getattr(generated, stub.cls)
  required = [n for n, p in list(inspect.signature(stub_class.__init__).parameters.items())[1:]
              if p.default is p.empty]
  with pytest.raises(NotImplementedError, match=f'{stub.cls} is a stub: {re.escape(stub.reason)}'):
    stub_class(**dict.fromkeys(required))  # the interface the classes around it build it through
  assert '# STUB: not ported' in out.read_text()
  assert ruff_check(str(out)) == ([], [])


def test_a_port_with_a_stub_is_never_reported_proven(tmp_path):
  result, _, _ = _port(tmp_path, 'uses_unknown_layer', linen_models.uses_unknown_layer())
  assert [stub.cls for stub in result.stubs] and not result.proven


def test_a_field_left_none_and_given_a_value_is_traced_at_each(tmp_path):
  # `bias_init=None` takes no parameter; given an initializer, the branch
  # makes one shaped by `x` after `x` is rebound: its own symbolic trace
  # (None tells the instances apart) gives the shape, `(config.width,)`.
  result, out = _written(tmp_path, 'untraced_after_rebinding', linen_models.untraced_after_rebinding())
  assert not result.stubs
  assert 'self.bias = nnx.Param(config.bias_init(rngs.params(), (config.width,)))' in out.read_text()


def test_a_function_handed_the_module_under_a_flag_and_under_a_test_never_taken(tmp_path):
  # The flag's flip makes the table: traced apart from the instance that
  # makes none (its variables tell them apart), the table's shape is known.
  # The branch no configuration takes raises, as one making modules.
  result, out = _written(tmp_path, 'handed_behind_a_flag', linen_models.handed_behind_a_flag())
  assert not result.stubs
  text = out.read_text()
  assert "if use_pos:\n      self.pos = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, x_shape[0], width)))" in text
  assert 'wide_pos' not in text and text.count('raise NotImplementedError') == 2  # __init__ and __call__
  assert [b.branch for b in result.branches] == ['`if self.width > 64`']


def test_an_untraced_else_is_reported_by_its_test_and_side_and_raises(tmp_path):
  result, out = _written(tmp_path, 'untraced_else', linen_models.untraced_else())
  assert not result.stubs
  (branch,) = result.branches
  assert (branch.cls, branch.test, branch.is_else) == ('UntracedElse', 'self.width <= 64', True)
  assert branch.branch == 'the else branch of `if self.width <= 64`' and branch.refused is None
  generated = import_file(str(out))
  generated.UntracedElse(width=16, in_features=5, rngs=nnx.Rngs(0))
  with pytest.raises(NotImplementedError, match='the else branch of `if self.width <= 64` was not traced'):
    generated.UntracedElse(width=65, in_features=5, rngs=nnx.Rngs(0))


@pytest.mark.nightly  # CI: test_golden.py's refused_flag_branch (the same model's text), test_only_the_configurations_that_stop_a_class_are_left_out
def test_a_branch_only_a_flipped_flag_takes_that_the_port_cannot_write_raises(tmp_path):
  # The class is written for the configuration given, not stubbed, and the
  # configuration the proof adds (per_example=True) is left out (the report and
  # the proof: below, nightly).
  result, out = _written(tmp_path, 'refused', golden_refused.model())
  assert not result.stubs and list(result.left_out) == ['per_example=True']
  (branch,) = result.branches
  assert (branch.cls, branch.branch) == ('Encoder', '`if self.per_example`') and 'nn.vmap' in branch.refused
  assert "PathRule('block_{i}/Dense_0/kernel', 'blocks/{i}/dense/kernel')" in result.paths_text
  generated = import_file(str(out))
  with pytest.raises(NotImplementedError, match='`if self.per_example` is not written: nn.vmap of a module'):
    generated.Encoder(per_example=True, in_features=5, rngs=nnx.Rngs(0))


def test_only_the_configurations_that_stop_a_class_are_left_out(tmp_path):
  # per_example=True stops it; left out, batched=True stops it elsewhere:
  # left out too; extra=True is written (and proven with the rest).
  result, out = _written(tmp_path, 'two_refused_flags', linen_models.two_refused_flags())
  assert not result.stubs and sorted(result.left_out) == ['batched=True', 'per_example=True']
  assert {b.branch for b in result.branches} == {'`if self.per_example`', '`if self.batched`'}
  assert all('nn.vmap of a module' in b.refused for b in result.branches)
  assert 'extra=True' in [d for _, d, _ in result.flags]
  assert "self.extra_ = nnx.Linear(3, 2, rngs=rngs)" in out.read_text()


@pytest.mark.nightly
def test_a_branch_only_a_flipped_flag_takes_that_the_port_cannot_write_raises_and_is_not_proven(tmp_path):
  # The class is written for the configuration given, not stubbed; the
  # configuration the proof added (per_example=True) is reported, not proven.
  out = tmp_path / 'refused_nnx.py'
  result = port(golden_refused.model(), str(out), factory='tests.converters.port.golden.refused_flag_branch:model')
  assert result.proven and not result.stubs, (result.failure, result.checks)
  assert list(result.left_out) == ['per_example=True']
  assert 'nn.vmap of a module' in result.left_out['per_example=True']
  (branch,) = result.branches
  assert (branch.cls, branch.branch) == ('Encoder', '`if self.per_example`') and 'nn.vmap' in branch.refused
  assert ('another configuration (per_example=True)', 'raises NotImplementedError') in [c[:2] for c in result.checks]
  assert not any(c[0] == 'another configuration (per_example=True)' and c[1] == 'passed' for c in result.checks)
  generated = import_file(str(out))
  with pytest.raises(NotImplementedError, match='`if self.per_example` is not written: nn.vmap of a module'):
    generated.Encoder(per_example=True, in_features=5, rngs=nnx.Rngs(0))
  # Given the configuration's own, a model of another depth is the Linen one.
  assert result.modes == {'deterministic': False}
  assert_generated_port(LinenModel(golden_refused.Encoder(depth=3), jnp.ones((3, 4)), deterministic=True),
                        generated, modes=result.modes)


@pytest.mark.nightly  # CI: test_golden.py's shared_scope
def test_a_layer_sharing_its_creators_scope_is_an_attribute_mapped_from_that_scope(tmp_path):
  _, out = _pinned(tmp_path, 'lora')
  text = out.read_text()
  assert 'share_scope(' not in text
  assert '    self.dense = nnx.Linear(in_features, features, rngs=rngs)\n' in text
  rules = {(r.linen, r.nnx) for r in port_paths(import_file(str(out))).rules}
  assert {('lora/kernel', 'lora/dense/kernel'), ('lora/bias', 'lora/dense/bias'), ('lora/A', 'lora/A')} <= rules


def test_draws_are_from_the_rngs_the_port_keeps_and_proven_with_the_same_keys(tmp_path):
  # `train` does more than set modes (the word dropout returns early): an
  # argument of the call still, proven turned round too (nightly,
  # `PINNED`), the draws compared.
  result, out = _pinned(tmp_path, 'noisy_embedder')
  assert result.modes == {}
  text = out.read_text()
  assert text.count('    self.rngs = rngs\n') == 2
  assert 'jax.random.bernoulli(self.rngs.dropout(), p=self.rate, shape=ids.shape)' in text
  assert 'x = x + jax.random.normal(self.rngs.noise(), x.shape)' in text


@pytest.mark.nightly
def test_a_port_drawing_otherwise_is_not_proven(tmp_path):
  result, out = _written(tmp_path, 'noisy_embedder', linen_models.noisy_embedder())
  text = out.read_text()
  # A port drawing otherwise (another distribution; another rate, in training only) is not proven.
  for edit, kwargs in [(('jax.random.normal(', 'jax.random.uniform('), {'train': False}),
                       (('p=self.rate', 'p=1 - self.rate'), {'train': True})]:
    wrong = _edited(out, tmp_path / 'wrong_nnx.py', text.replace(*edit))
    model = linen_models.noisy_embedder()
    with pytest.raises(AssertionError, match='disagree in eval mode|not in a training step'):
      assert_generated_port(LinenModel(model.module, *model.args, **kwargs), import_file(str(wrong)))


def test_layers_made_by_fields_are_made_through_them(tmp_path):
  # The field holds a partial with settings of its own: NNX's, given to the port.
  _, out = _pinned(tmp_path, 'layer_from_partial_field')
  text = out.read_text()
  assert 'layer: Any = nnx.Linear,' in text or 'layer: Any = nnx.Linear, *' in text
  assert '= layer(in_features, 4, rngs=rngs)' in text


def test_merge_param_is_kept_and_the_flag_proven_both_ways(tmp_path):
  # (Proven with the flag turned round: nightly, `PINNED`.)
  _, out = _pinned(tmp_path, 'merged_flag')
  assert "nn.module.merge_param('plain', self.plain, plain)" in out.read_text()


def test_a_flax_layer_class_handed_on_is_nnx_s(tmp_path):
  # Written here; proven by the nightly test below.
  result, out = _written(tmp_path, 'hands_on_a_class', linen_models.hands_on_a_class())
  assert not result.stubs
  text = out.read_text()
  assert 'LayerFromField(layer=nnx.Linear, in_features=in_features, rngs=rngs)' in text
  assert 'LayerFromField(nnx.Linear, in_features=4, rngs=rngs)' in text
  # Partials written in place, a mode in one.
  result, out = _written(tmp_path, 'hands_on_partials', linen_models.hands_on_partials())
  assert not result.stubs and result.modes == {'train': True}
  text = out.read_text()
  assert '        layer=functools.partial(nnx.Linear, use_bias=False),\n' in text
  assert '        norm=functools.partial(nnx.BatchNorm, momentum=0.8),\n' in text


@pytest.mark.nightly
@pytest.mark.parametrize('name', ['hands_on_a_class', 'hands_on_partials', 'widening_stack'])
def test_flax_layer_classes_and_partials_handed_on_are_proven(tmp_path, name):
  result, _, _ = _port(tmp_path, name, getattr(linen_models, name)())
  assert result.proven, (result.failure, result.checks)


def test_partials_handed_on_are_nnx_partials_and_blocks_widen_their_shortcut(tmp_path):
  # Written here; proven (its train step as one replica of 'batch') nightly, below.
  result, out = _written(tmp_path, 'widening_stack', linen_models.widening_stack())
  assert not result.stubs and result.modes == {'train': True}
  text = out.read_text()
  assert 'dense = functools.partial(nnx.Linear, use_bias=False)\n' in text
  assert "norm = functools.partial(nnx.BatchNorm, momentum=0.8, axis_name='batch')\n" in text
  assert 'block(width, dense=dense, norm=norm, in_features=in_features, rngs=rngs)' in text
  assert 'in_features = width * 4\n' in text and 'if in_features != width * 4:' in text
  assert 'self.batch_norm = norm(width, rngs=rngs)' in text


@pytest.mark.nightly  # CI: test_partials_handed_on_are_nnx_partials_and_blocks_widen_their_shortcut (a shortcut from widths)
def test_a_block_with_strides_is_given_its_shortcut_from_strides_and_widths(tmp_path):
  # Every traced block has the shortcut; the sizes and strides around it say when.
  result, out = _written(tmp_path, 'flax_imagenet_block', linen_models.flax_imagenet_block())
  assert not result.stubs
  assert 'if in_features != filters or strides != (1, 1):' in out.read_text()


def test_a_call_scanned_over_time_is_nnx_scan_over_the_method(tmp_path):
  # Written here; proven by the nightly test below.
  result, out = _written(tmp_path, 'scanned_over_time', linen_models.scanned_over_time())
  assert not result.stubs
  text = out.read_text()
  assert (
      '  @nnx.scan(in_axes=(None, nnx.Carry, 1), out_axes=(nnx.Carry, 1))\n'
      '  def __call__(self, carry, x):\n'
      '    return self.lstm_cell(carry, x)\n'
  ) in text
  assert 'def __init__(self, features: int, *, in_features: int, rngs: nnx.Rngs):' in text
  # An output Linen does not scan is NNX's broadcast one.
  _, out = _written(tmp_path, 'scanned_with_broadcast_output', linen_models.scanned_with_broadcast_output())
  assert '@nnx.scan(in_axes=(None, nnx.Carry, 1), out_axes=(nnx.Carry, (1, None)))' in out.read_text()
  # (A cell of the user's that nn.RNN scans, not its own method, is still
  # refused: `cell_under_rnn`, below.)


@pytest.mark.nightly
def test_a_call_scanned_over_time_is_proven(tmp_path):
  result, _, _ = _port(tmp_path, 'scanned_over_time', linen_models.scanned_over_time())
  assert result.proven, (result.failure, result.checks)


@pytest.mark.nightly  # CI: test_a_call_scanned_over_time_is_nnx_scan_over_the_method (sst2's scan over time), test_zoo_ports.py::test_lstm_trains_on_in_the_fused_cell_exactly and model_zoo/test_rnn.py::test_the_port_to_nnx_optimized_cell_computes_the_same_logits (the fused gates)
def test_flax_sst2_lstm_is_written_with_nnx_s_fused_cell_and_its_carry(tmp_path):
  # Written here; proven, with its written test, by the nightly test below.
  result, out = _written(tmp_path, 'flax_sst2_bilstm', linen_models.flax_sst2_bilstm())
  assert not result.stubs
  text = out.read_text()
  assert 'self.optimized_lstm_cell = nnx.OptimizedLSTMCell(in_features, hidden_size, rngs=rngs)' in text
  # The throwaway cell asked for its (zero) carry: the cell the module holds.
  assert 'return self.optimized_lstm_cell.initialize_carry(input_shape, nnx.Rngs(jax.random.key(0)))' in text
  assert 'self.forward_lstm = SimpleLSTM(hidden_size, in_features=in_features, rngs=rngs)' in text
  # Linen's eight gate variables are NNX's two kernels and one bias, side by side.
  assert ("'forward_lstm/optimized_lstm_cell/dense_i/kernel',\n"
          "        transform=Rearrange('i h -> i (gate h)'),") in result.paths_text
  assert 'functools' not in text and 'nn.' not in text.replace('nnx.', '')


def test_defaults_computed_with_the_class_are_module_constants_each_its_own(tmp_path):
  result, out = _written(tmp_path, 'scaled_by_defaults', linen_models.scaled_by_defaults())
  assert not result.stubs
  text = out.read_text()
  assert 'default_w_init = nnx.initializers.normal(0.1)\n' in text
  assert 'default_w_init_scaledtwicebydefault = nnx.initializers.normal(0.2)\n' in text
  assert 'def __init__(self, w_init: Any = default_w_init_scaledtwicebydefault, *,' in text
  assert ruff_check(str(out)) == ([], [])


@pytest.mark.nightly  # CI: `test_a_flag_merged_with_a_field_named_as_a_mode_is_kept_and_proven_both_ways`
def test_flax_sst2_keeps_its_merged_flags_as_nnx_s_layers_do(tmp_path):
  # Written here; proven, with its written test, by the nightly test below.
  result, out = _written(tmp_path, 'flax_sst2', linen_models.flax_sst2())
  assert not result.stubs and result.modes == {}
  text = out.read_text()
  # The field model.eval() sets, the argument first: a model in eval mode
  # still runs as its call says (Linen's merge_param refuses both given).
  assert text.count("deterministic = first_from(deterministic, self.deterministic, error_msg=") == 6
  assert 'from flax.nnx.module import first_from' in text
  assert 'self.dropout_layer(hidden, deterministic=deterministic)' in text
  # A default Linen computes with the class is a module constant, as Flax's layers write it.
  assert 'default_embedding_init = nnx.initializers.normal(stddev=0.1)' in text
  assert 'embedding_init: Callable[..., Array] = default_embedding_init,' in text
  assert 'rng = self.rngs.dropout()' in text


def test_a_flag_merged_with_a_field_named_as_a_mode_is_kept_and_proven_both_ways(tmp_path):
  # (Proven with the flag turned round: nightly, `PINNED`.)
  _, out = _pinned(tmp_path, 'flag_named_as_a_mode')
  assert 'deterministic = first_from(deterministic, self.deterministic, error_msg=' in out.read_text()


@pytest.mark.nightly
@pytest.mark.parametrize('name', ['flax_sst2', 'flax_sst2_by_its_call'])
def test_flax_sst2_is_proven_and_its_checkpoint_trains_on(tmp_path, name):
  result, _, test_out = _port(tmp_path, name, getattr(linen_models, name)())
  assert result.proven, (result.failure, result.checks)
  if name == 'flax_sst2_by_its_call':
    # Its dropouts, each drawing from the stream it forks, compared draw by draw.
    assert _outcome(result, 'another configuration (deterministic=False, a flag of the call)') == 'passed'
  _run_written_test(test_out, tmp_path)


@pytest.mark.nightly
def test_flax_sst2_lstm_is_proven_and_its_checkpoint_trains_on(tmp_path):
  result, _, test_out = _port(tmp_path, 'flax_sst2_bilstm', linen_models.flax_sst2_bilstm())
  assert result.proven, (result.failure, result.checks)
  assert any(check.startswith("nnx.OptimizedLSTMCell's gates") for check, _, _ in result.checks)
  _run_written_test(test_out, tmp_path)


def test_an_input_that_is_not_an_array_stays_a_python_value(tmp_path):
  # jnp.tile wants the count concrete: written (and proven, `PINNED`) as the source passes it.
  _, out = _pinned(tmp_path, 'tiled_by')
  assert 'jnp.tile(' in out.read_text()


def _assert_imagenet_written_through_its_factories(result, text):
  assert not result.stubs and result.modes == {'train': True}
  assert 'conv: ModuleDef = nnx.Conv' in text and 'act: Callable = nnx.relu' in text
  assert 'conv = partial(self.conv, use_bias=False, dtype=dtype)\n' in text
  assert "norm = partial(nnx.BatchNorm, momentum=0.9, epsilon=1e-5, dtype=dtype, axis_name='batch')\n" in text
  assert 'self.conv_0 = conv(in_features, filters, (3, 3), strides, rngs=rngs)' in text
  assert 'self.batch_norm_1 = norm(filters, scale_init=nnx.initializers.zeros_init(), rngs=rngs)' in text
  assert 'if in_features != filters or strides != (1, 1):' in text
  assert 'self.blocks.append(' in text
  assert 'def __call__(self, x):\n    x = self.conv_init(x)\n' in text  # the partials went to __init__


@pytest.mark.nightly  # forty seconds each
@pytest.mark.parametrize('name', ['flax_imagenet', 'flax_imagenet_bottleneck', 'flax_imagenet_two_blocks_a_stage',
                                  'flax_imagenet_bottleneck_two_one'])
def test_flax_imagenet_is_proven_and_its_checkpoint_trains_on_as_one_replica(tmp_path, name):
  result, out, test_out = _port(tmp_path, name, getattr(linen_models, name)())
  assert result.proven, (result.failure, result.checks)
  if name.startswith('flax_imagenet_bottleneck'):
    assert 'if in_features != filters * 4 or strides != (1, 1):' in out.read_text()
  elif name == 'flax_imagenet':
    _assert_imagenet_written_through_its_factories(result, out.read_text())
    _run_written_test(test_out, tmp_path)


@pytest.mark.parametrize('name, reason', [
    ('stepwise_local', "'groups' is computed in steps"),
    ('fuse', 'in a module of several array inputs'),
    ('tiled_twice', 'changes with n in a way the port cannot write'),
    # Linear at the traced width and the two after it, not far from it.
    ('floored', 'changes with width in a way the port cannot write'),
    ('capped', 'changes with width in a way the port cannot write'),
    # Seen from outside nn.RNN's scan only (Flax's seq2seq decoder cell).
    ('cell_under_rnn', 'Cell is called only inside a transform'),
    # Its keys split per step, which the proof's draws (in call order) are not.
    ('scanned_noise', "self.make_rng('noise') in a module Linen runs under a lifted transform"),
    ('partial_of_partial', 'norm is a partial of the partial base; write it as one partial'),
])
def test_what_would_hold_at_the_traced_configuration_only_is_refused(tmp_path, name, reason):
  # Written only: the writer refuses these; a port with stubs is never
  # reported proven (test_a_port_with_a_stub_is_never_reported_proven).
  result, _ = _written(tmp_path, name, getattr(linen_models, name)())
  assert any(reason in stub.reason for stub in result.stubs), [s.reason for s in result.stubs]


def test_a_port_right_only_for_the_traced_inputs_is_not_proven(tmp_path):
  # Both streams were 4 wide when traced: the port is proven there, and its
  # proof at other sizes fails, which the result says (exit 1).
  result, _, _ = _port(tmp_path, 'two_streams', linen_models.two_streams())
  assert not result.proven and not result.stubs
  assert 'another configuration' in result.checks[-1][0] and result.checks[-1][1] == 'FAILED'
  assert result.failure.startswith('at n=2')


def test_awkward_names_arguments_and_loops_are_written_right(tmp_path):
  result, out = _pinned(tmp_path, 'awkward')
  text = out.read_text()
  assert 'self.class_ = nnx.Linear(in_features, 4, use_bias=False, rngs=rngs)' in text
  assert "PathRule('class/kernel', 'class_/kernel')" in result.paths_text
  assert 'for (i, w), dense in zip(enumerate(self.widths), self.denses):' in text
  assert 'def __init__(self, widths: tuple[int, ...] = (4, 4), *,' in text


def test_a_norm_over_another_axis_takes_that_axis_size(tmp_path):
  # Proven as traced and at another image size (nightly, `PINNED`).
  _, out = _pinned(tmp_path, 'channels_first')
  assert 'nnx.BatchNorm(4, axis=1, rngs=rngs)' in out.read_text()


def test_a_port_never_writes_over_its_source(tmp_path):
  from converters.port import PortOutputError

  source = os.path.realpath(linen_models.__file__)
  before = open(source).read()
  with pytest.raises(PortOutputError, match='read from'):
    port(linen_models.stack(), source, factory=f'{FACTORIES}:stack')
  assert open(source).read() == before


def test_a_port_into_a_missing_directory_is_refused_before_it_traces(tmp_path, monkeypatch):
  from converters.port import PortOutputError, generate

  monkeypatch.setattr(generate, 'write', lambda *a, **k: pytest.fail('traced before the path was checked'))
  for out, test_out in ((tmp_path / 'missing' / 'x_nnx.py', None),
                        (tmp_path / 'x_nnx.py', tmp_path / 'missing' / 'test_x.py')):
    with pytest.raises(PortOutputError, match='does not exist; create it first'):
      generate.port(linen_models.stack(), str(out), factory=f'{FACTORIES}:stack',
                    test_out=str(test_out) if test_out else None)
  assert list(tmp_path.iterdir()) == []


def test_the_written_test_runs_without_the_port_extra():
  # What the test file imports must not need libcst (the `port` extra):
  # users' CI runs it where only the kit is installed.
  import subprocess
  import sys

  code = ('import sys\nfrom converters.port import assert_checkpoint_trains_on, assert_generated_decoding, '
          'assert_generated_port, decoding_configurations, import_file\n'
          "assert 'libcst' not in sys.modules, 'libcst imported'\n")
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr


def test_the_written_header_names_the_module_as_imported_from_where_the_command_ran(tmp_path, monkeypatch):
  from converters.port.generate import _import_name

  monkeypatch.chdir(tmp_path)
  assert _import_name('ports/models_nnx.py') == 'ports.models_nnx'
  assert _import_name(str(tmp_path / 'models_nnx.py')) == 'models_nnx'
  assert _import_name('../elsewhere/models_nnx.py') == 'models_nnx'
  assert _import_name('my-ports/models_nnx.py') == 'models_nnx'  # not importable as a package
  # --out spelled through a symlink to where the command runs.
  (tmp_path / 'work' / 'ports').mkdir(parents=True)
  (tmp_path / 'link').symlink_to(tmp_path / 'work')
  monkeypatch.chdir(tmp_path / 'work')
  assert _import_name(str(tmp_path / 'link' / 'ports' / 'models_nnx.py')) == 'ports.models_nnx'


def test_a_field_left_none_is_written_as_the_source_reads_it_and_a_port_ignoring_it_is_not_proven(tmp_path):
  # nlp_seq's MlpBlock: `x.shape[-1] if self.out_dim is None else self.out_dim`
  # is written as the source reads it, right for every `out_dim`, and
  # proven with it given a value.
  result, out, _ = _port(tmp_path, 'optional_out', linen_models.optional_out())
  assert result.proven, (result.failure, result.checks)
  assert _outcome(result, 'another configuration (out_dim=12)') == 'passed'
  text = out.read_text()
  written = 'nnx.Linear(mlp_dim, in_features if out_dim is None else out_dim, rngs=rngs)'
  assert written in text
  # A port writing the traced branch only (the input's width) is not proven there.
  planted = import_file(str(_edited(out, tmp_path / 'ignoring_nnx.py',
                                    text.replace(written, 'nnx.Linear(mlp_dim, in_features, rngs=rngs)'))))
  given = LinenModel(linen_models.OptionalOut(out_dim=12), *linen_models.optional_out().args)
  with pytest.raises(Exception, match='shape'):
    assert_generated_port(given, planted)


def test_a_value_the_configuration_refuses_is_skipped_for_the_next():
  # 12, the first value tried, is refused by the module's own check; 16 is
  # taken, none left unproven. That a configuration found here is proven
  # through `port()`: test_a_field_left_none_is_written_as_the_source_reads_it_and_a_port_ignoring_it_is_not_proven
  # (out_dim=12); this one's proof, nightly (below).
  found, unproven = prove.optional_configurations(linen_models.validated_out())
  assert [d for _, d in found] == ['out_dim=16'] and unproven == []
  assert found[0][0].module.out_dim == 16


# CI: test_a_value_the_configuration_refuses_is_skipped_for_the_next (above)
# finds out_dim=16; test_a_field_left_none_is_written_as_the_source_reads_it_and_a_port_ignoring_it_is_not_proven
# checks that 'another configuration (out_dim=12)' found so passes through port().
@pytest.mark.nightly
def test_a_value_the_configuration_refuses_is_skipped_for_the_next_and_proven(tmp_path):
  result, _, _ = _port(tmp_path, 'validated_out', linen_models.validated_out())
  assert _outcome(result, 'another configuration (out_dim=16)') == 'passed'
  assert 'another configuration (out_dim=12)' not in {check for check, _, _ in result.checks}
  assert result.proven, (result.failure, result.checks)


def test_the_floats_of_the_configuration_are_proven_moved_and_tuples_shorter(tmp_path):
  # Proven moved (nightly, `PINNED`); every configuration keeps the traced
  # layers, so all go through the written PATHS (a rule missing for one is
  # not covered, and the port not proven).
  _, out = _pinned(tmp_path, 'float_fields')
  assert 'epsilon' in out.read_text()


@pytest.mark.nightly
def test_the_floats_and_tuples_inside_a_namespace_are_proven_moved_too(tmp_path):
  result, _, _ = _port(tmp_path, 'stack', linen_models.stack())
  assert _outcome(result, 'another configuration (config.rate=0.5, config.widths=())') == 'passed'


def test_layers_linen_numbers_around_a_loop_are_mapped_for_any_length(tmp_path):
  # One `Dense` before the loop's and two after (the port guide's MLP has
  # the head alone, `Dense_{len(widths)}`: test_random_programs pins it):
  # `Dense_{i+1}`, `Dense_{n}`, `Dense_{n+1}`, and every other configuration,
  # the loop emptied too, converts through the written PATHS (nightly, `PINNED`).
  result, _ = _pinned(tmp_path, 'loop_between_layers')
  for template in ("'Dense_0/kernel'", "'Dense_{i+1}/kernel'", "'Dense_{n}/kernel'", "'Dense_{n+1}/kernel'"):
    assert f'PathRule({template}' in result.paths_text


def test_layers_no_template_numbers_for_every_length_are_not_proven(tmp_path):
  # Two loops of Dense: the second's numbers start after the first's length.
  # The classes hold at every configuration, PATHS only at the traced one:
  # not handed over as proven, and the report names the rules it lacks.
  result, _, _ = _port(tmp_path, 'two_loops', linen_models.two_loops())
  assert not result.proven
  rows = {name: (outcome, why) for name, outcome, why in result.checks}
  (uncovered,) = [name for name, (outcome, _) in rows.items() if outcome == 'NOT COVERED']
  assert uncovered.startswith('PATHS at that configuration (')
  assert 'PATHS does not map' in result.failure and '--paths infer' in result.failure


@pytest.mark.nightly  # CI writes a string-switched class as the golden `class_token`
def test_every_value_a_string_or_enum_field_switches_on_is_written_and_proven(tmp_path):
  # Before: the RMSNorm branch stubbed the class ("created where no traced
  # configuration went") and the tanh branches were copied untried.
  result, _, _ = _port(tmp_path, 'switched_by_strings', linen_models.switched_by_strings())
  assert result.proven, (result.failure, result.checks)
  for change in ('norm=NormKind.RMS', "activation='gelu'", "activation='scaled_tanh'", "activation='tanh'"):
    assert _outcome(result, f'another configuration ({change})') == 'passed'
  assert "PathRule('RMSNorm_0/scale'" in result.paths_text


def test_what_the_port_writes_passes_its_own_lint(tmp_path):
  _, out = _pinned(tmp_path, 'initialized_in_place')
  assert ruff_check(str(out)) == ([], [])
  text = out.read_text()
  assert 'self.w = nnx.Param(jax.random.normal(rngs.params(), (in_features, features)) * 0.02)' in text
  assert '(lambda' not in text and 'x.shape' not in text, text
  # An argument put in the lambda's body keeps its own precedence: the
  # initial value is Linen's (the proofs overwrite parameters, so say it here).
  assert 'nnx.Param(-(features - 2.0) * jnp.ones((features,)))' in text, text
  from flax import nnx
  written = import_file(str(out)).InitializedInPlace(in_features=5, rngs=nnx.Rngs(0))
  model = linen_models.initialized_in_place()
  linen_offset = model.module.init(jax.random.key(0), jnp.ones((2, 3, 5)))['params']['offset']
  assert (written.offset[...] == linen_offset).all()


def test_values_sown_into_any_collection_are_outputs_of_the_call_as_in_linen(tmp_path):
  model = linen_models.sows_a_loss()
  _, out = _pinned(tmp_path, 'sows_a_loss')
  text = out.read_text()
  assert 'class Losses(nnx.Intermediate):' in text and "self.sow(Losses, 'activity'" in text, text
  written = import_file(str(out))
  # What is sown, compared through the written PATHS: the checks compare outputs, not sown values.
  x = jax.random.normal(jax.random.key(0), (4, 3))
  variables = model.module.init(jax.random.key(1), x)
  assert set(variables) == {'params', 'losses'}  # Linen's init keeps what it sows but intermediates
  linen_out, sown = model.module.apply({'params': variables['params']}, x, mutable=['losses', 'intermediates'])
  from converters import linen_to_nnx
  from flax import nnx
  port = linen_to_nnx({'params': variables['params']}, target=written.SowsALoss(in_features=3, rngs=nnx.Rngs(0)),
                      paths=port_paths(written))
  nnx_out, losses = nnx.capture(port, written.Losses)(x)
  _, hidden = nnx.capture(port, nnx.Intermediate)(x)
  assert (nnx_out == linen_out).all()
  for written_values, linen_values in ((losses, sown['losses']), (hidden, sown['intermediates'])):
    assert jax.tree.structure(nnx.to_pure_dict(written_values)) == jax.tree.structure(linen_values)
    for a, b in zip(jax.tree.leaves(nnx.to_pure_dict(written_values)), jax.tree.leaves(linen_values)):
      assert (a == b).all()


def test_the_lint_runs_ruffs_own_binary_and_reports_what_it_finds(tmp_path):
  from converters.port import emit

  assert os.path.basename(emit._RUFF[0]).startswith('ruff')  # no Python process started per check
  path = tmp_path / 'unused.py'
  path.write_text('import os\nimport sys\n\nprint(sys.argv, undefined)\n')
  findings, kept = ruff_check(str(path))
  assert path.read_text() == 'import sys\n\nprint(sys.argv, undefined)\n'  # the unused import fixed
  assert kept == [] and [f.split(': ', 1)[1].split(' ')[0] for f in findings] == ['F821']


def test_a_lint_that_cannot_run_fails_the_port_never_passes_it(tmp_path, monkeypatch):
  from converters.port import PortToolError, emit

  monkeypatch.setattr(emit, '_RUFF', [sys.executable, '-m', 'no_such_ruff_module'])
  with pytest.raises(PortToolError, match=r"ruff could not check the port .*pip install -e '\.\[port\]'"):
    emit.ruff_check(str(tmp_path / 'any.py'))


def test_an_input_size_the_code_ties_to_a_field_is_stated_and_proven_as_tied(tmp_path):
  # scico's DnCNN: `x - y`, y of `channels` features. The port takes x's
  # channels to be `channels` (no `in_features`), says so, and is proven on
  # inputs so: before, proven at channels=2 on a 1-channel input (Linen
  # broadcasts), it failed.
  # (The statement and the proof on inputs so: nightly, `PINNED`.)
  result, out = _pinned(tmp_path, 'residual_denoiser')
  assert 'self.conv_0 = nnx.Conv(channels, features' in out.read_text()
  assert prove.tie_descriptions(result.ties) == ['x.shape[-1] == self.channels']


@pytest.mark.nightly  # CI writes this as the golden `stub_in_a_branch`
def test_one_stub_is_that_class_alone_the_rest_written_mapped_and_proven_around_it(tmp_path):
  from tests.converters.port.golden import stub_in_a_branch

  out = tmp_path / 'stub_in_a_branch_nnx.py'
  result = port(stub_in_a_branch.model(), str(out), factory='tests.converters.port.golden.stub_in_a_branch:model')
  assert [s.cls for s in result.stubs] == ['PoolingHead'] and not result.proven
  assert _outcome(result, 'Encoder alone, around the stubs (as Encoder_0, traced configuration)') == 'passed'
  generated = import_file(str(out))
  # The parent builds the stub through the interface it states, and fails there only.
  with pytest.raises(NotImplementedError, match='PoolingHead is a stub'):
    generated.Classifier(8, in_features=5, rngs=nnx.Rngs(0))
  paths = port_paths(generated)
  variables = jax.eval_shape(lambda: stub_in_a_branch.model().module.init(
      jax.random.key(0), jnp.ones((2, 4, 5))))['params']
  linen = [tuple(k.key for k in p) for p, _ in jax.tree_util.tree_flatten_with_path(variables)[0]]
  bound = paths.bound('linen', linen)
  mapped = {p for p in linen if bound.match_all('linen', p)}
  assert {p for p in linen if p not in mapped} == {
      ('PoolingHead_0', 'Dense_0', 'bias'), ('PoolingHead_0', 'Dense_0', 'kernel'), ('PoolingHead_0', 'probe')}
  assert '#   PoolingHead_0/probe\n' in pathlib.Path(paths_file(str(out))).read_text()


@pytest.mark.nightly  # CI writes this as the golden `untraced_branch`
def test_a_branch_no_configuration_takes_is_written_to_raise_and_the_rest_proven(tmp_path):
  result, out, _ = _port(tmp_path, 'untraced_creation', linen_models.untraced_creation())
  assert result.proven, (result.failure, result.checks)
  (branch,) = result.branches
  assert (branch.cls, branch.branch) == ('UntracedCreation', '`if self.config.extra and self.config.deep`')
  generated = import_file(str(out))
  config = generated.HostileConfig if hasattr(generated, 'HostileConfig') else linen_models.HostileConfig
  with pytest.raises(NotImplementedError, match='was not traced, so the port does not write it'):
    generated.UntracedCreation(config(extra=True, deep=True), in_features=3, rngs=nnx.Rngs(0))
  generated.UntracedCreation(config(extra=True), in_features=3, rngs=nnx.Rngs(0))  # the traced branch


def test_a_size_inside_a_namespace_is_written_with_it_and_proven_varied(tmp_path):
  # vit_jax's `patches.size`: the Dense after the patches takes the patch
  # count as the source computes it, and the port is proven at
  # patches.size=(5, 5) too. Before, it read the traced 4: not proven.
  # (Proven at patches.size=(5, 5): nightly, `PINNED`.)
  _, out = _pinned(tmp_path, 'patchify')
  text = out.read_text()
  assert 'x_shape[0] // patches.size[0] * (x_shape[1] // patches.size[-1]) * hidden,' in text
  # The traced patch size written in: right at the traced one only.
  baked = _edited(out, tmp_path / 'baked_nnx.py', text.replace('patches.size[0]', '4').replace('patches.size[-1]', '4'))
  other = LinenModel(linen_models.Patchify(types.SimpleNamespace(size=(5, 5))), jnp.ones((2, 16, 16, 3)))
  assert_generated_port(linen_models.patchify(), import_file(str(baked)))
  with pytest.raises(Exception, match='shape'):
    assert_generated_port(other, import_file(str(baked)))


def test_a_proof_within_a_tolerance_names_the_layers_nnx_computes_otherwise():
  from converters.port import generate, prove

  assert generate.tolerance_checks(frozenset({nn.SelfAttention, nn.Dense}), 0.0) == []  # bit for bit
  rows = generate.tolerance_checks(frozenset({nn.SelfAttention, nn.Dense}), prove.FUSED_ATTENTION_ATOL)
  assert [(check.split("'")[0], outcome) for check, outcome, _ in rows] == [('nnx.MultiHeadAttention', 'within 0.0001')]
  rows = generate.tolerance_checks(frozenset({nn.OptimizedLSTMCell}), prove.FUSED_CELL_ATOL)
  assert [check.split("'")[0] for check, *_ in rows] == ['nnx.OptimizedLSTMCell']
  # A port that merely says so in its text (a docstring) is not one.
  assert generate.tolerance_checks(frozenset({nn.Dense}), prove.FUSED_ATTENTION_ATOL) == []


def test_a_transform_of_a_module_in_a_branch_no_configuration_took_raises_there(tmp_path):
  # `nn.remat(Residual)` where no trace went: the branch raises, the rest is written.
  result, out = _written(tmp_path, 'maybe_rematted', linen_models.maybe_rematted())
  assert not result.stubs
  assert [(b.cls, b.branch) for b in result.branches] == [('MaybeRematted', '`if REMAT_BLOCKS`')]
  text = out.read_text()
  assert 'nn.remat' not in text and text.count('raise NotImplementedError(') == 2  # __init__ and __call__


def test_a_variable_one_instance_makes_is_shaped_by_its_trace_and_one_none_makes_raises(tmp_path):
  result, out = _pinned(tmp_path, 'two_pools')
  text = out.read_text()
  # Shaped by the `pool='tok'` instance's trace, the first not making it.
  assert "self.cls = nnx.Param(nnx.initializers.normal()(rngs.params(), (1, 1, in_features)))" in text
  assert [(b.cls, b.branch) for b in result.branches] == [('TokenPool', '`if REMAT_BLOCKS`')]
  assert 'self.scale' not in text


def test_two_layers_made_in_one_setup_list_are_one_nnx_list_numbered_as_linen_numbers_them(tmp_path):
  result, _ = _pinned(tmp_path, 'one_list_two_layers')
  assert "PathRule('layers_1/kernel', 'layers/1/kernel')" in result.paths_text


@pytest.mark.nightly  # CI: test_golden.py's named_by_fields
def test_a_statistic_named_by_a_field_is_the_attribute_each_instance_names(tmp_path):
  result, out = _pinned(tmp_path, 'named_counters')
  assert 'setattr(self, stat_name, nnx.BatchStat(jnp.ones((in_features,))))' in out.read_text()
  assert "PathRule('NamedCounter_1/b', 'named_counter_1/b')" in result.paths_text


@pytest.mark.parametrize('name, rule', [
    ('embedding_made_in_place', "PathRule('Embed_0/embedding', 'embed/embedding')"),
    ('embedding_named_by_a_local', "PathRule('Embed_0/embedding', 'embed/embedding')"),
    # NNX keeps it where its sorted traversal meets it first: `outer` keeps
    # no `emb` of its own, its `user` does.
    ('embedding_handed_on_twice', "PathRule('table/embedding', 'outer/user/emb/embedding')"),
])
def test_a_module_handed_to_another_is_the_nnx_module_the_class_holds(tmp_path, name, rule):
  result, out = _pinned(tmp_path, name)
  assert rule in result.paths_text
  assert 'nn.Embed' not in out.read_text()


def test_a_variable_made_in_the_dtype_of_a_value_of_the_call_takes_it_from_the_constructor(tmp_path):
  _, out = _pinned(tmp_path, 'positions_of_the_inputs_dtype')
  text = out.read_text()
  assert ', inputs_dtype: jnp.dtype = jnp.float32, x_dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):' in text
  assert 'nnx.initializers.normal(0.02)(rngs.params(), (1, inputs_shape[0], inputs_shape[-1]), inputs_dtype)' in text
  # Given another dtype, its variables are made in it, as Linen's for such inputs.
  generated = import_file(str(out))
  model = generated.PositionsOfTheInputsDtype(inputs_shape=(5, 3), inputs_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  assert model.pos_embedding[...].dtype == jnp.bfloat16 and model.probe[...].dtype == jnp.float32


def test_a_shared_layer_s_variables_made_in_its_setup_are_mapped_from_the_shared_scope(tmp_path):
  result, _ = _pinned(tmp_path, 'shared_embedding')
  assert "PathRule('p/embedding', 'p/emb/embedding')" in result.paths_text


def test_attributes_set_to_none_together_start_as_data(tmp_path):
  _, out = _pinned(tmp_path, 'norms_none_together')
  text = out.read_text()
  assert 'self.pre = self.post = nnx.data(None)' in text
  assert 'self.scale, self.shift = nnx.data(None), nnx.data(None)' in text


class _OwnNameError(nn.Module):
  """A module with an `axis_name` field whose own code raises NameError."""

  axis_name: str = 'batch'

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x) + undefined_scale  # noqa: F821


class _OwnReduction(nn.Module):
  """A module reducing over its own `axis_name` with JAX, after a Flax
  layer's failure over an unbound axis it caught."""

  axis_name: str = 'batch'

  @nn.compact
  def __call__(self, x):
    try:
      nn.LayerNorm(axis_name='replicas')(x)
    except NameError:
      pass
    return jax.lax.pmean(nn.Dense(2)(x), self.axis_name)


def test_an_unbound_axis_is_named_by_the_layer_that_reduces_over_it_and_only_then(tmp_path):
  from converters.port import PortInputError, generate

  with pytest.raises(PortInputError, match=r"LayerNorm\(axis_name='batch'\) reduces over a mapped axis"):
    generate._trace_model(linen_models.norm_over_replicas())
  for own in (_OwnNameError(), _OwnReduction()):  # the user's code: JAX's words alone
    with pytest.raises(PortInputError, match='NameError') as e:
      generate._trace_model(LinenModel(own, jnp.ones((2, 3))))
    assert 'mapped axis' not in str(e.value)


def test_an_unbound_axis_is_named_alike_with_jaxs_frames_in_the_traceback():
  from converters.port import PortInputError, generate

  filtering = jax.config.jax_traceback_filtering
  jax.config.update('jax_traceback_filtering', 'off')
  try:
    with pytest.raises(PortInputError, match=r"LayerNorm\(axis_name='batch'\) reduces over a mapped axis"):
      generate._trace_model(linen_models.norm_over_replicas())
    with pytest.raises(PortInputError, match='NameError') as e:
      generate._trace_model(LinenModel(_OwnReduction(), jnp.ones((2, 3))))
  finally:
    jax.config.update('jax_traceback_filtering', filtering)
  assert 'mapped axis' not in str(e.value)
