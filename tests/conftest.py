"""Test set-up: 8 simulated CPU devices and cheaper compile options
(`tests.compile_options`) before JAX loads, one compilation per program,
hypothesis profiles (`tests.hypothesis_profiles`), and the `property` marker
on every hypothesis property (`make nightly` runs them; `CI_EVERY_NTH` marks
the cases of some parametrized tests nightly but every n-th; `TEST_SHARD=k/n`
keeps the k-th of n shares of the tests collected).

Every distinct XLA program is compiled once per session: JAX's persistent
compilation cache, in a directory of the session's own that both test
processes share and that is removed at exit. Tests build the same models
again and again (each parametrization, each hypothesis example, each side
of a comparison), and compiling them is most of the suite's time; the
executables are those XLA builds anyway, so bit-for-bit comparisons are
unaffected.
"""

import os

from linen_nnx_cli.devices import simulate_cpu_devices
from tests import compile_options

if os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
  simulate_cpu_devices(8)
  compile_options.add_cheap()  # (`make nightly` names XLA's defaults)

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import is_hypothesis_test  # noqa: E402

# One cache for the session's processes: the first (pytest, or xdist's
# controller) makes it and removes it at exit; the workers it starts inherit
# its path, so a program one worker compiled serves the other.
# Its name holds the owner's pid: a session killed before its exit handler
# ran leaves its cache (up to a few hundred MB), which the next one removes.
_CACHE_PREFIX = 'linen-nnx-kit-tests-xla-'


def _remove_orphaned_caches() -> None:
  """Removes the caches whose owner's process has ended; leaves those of
  live processes and any whose name holds no pid."""
  for name in os.listdir(tempfile.gettempdir()):
    owner = name.removeprefix(_CACHE_PREFIX).split('-')[0]
    if not name.startswith(_CACHE_PREFIX) or not owner.isdigit():
      continue
    try:
      os.kill(int(owner), 0)
    except ProcessLookupError:
      shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)
    except OSError:  # alive, another user's
      pass


_compilation_cache = os.environ.get('LINEN_NNX_KIT_TESTS_XLA_CACHE')
if _compilation_cache is None:
  _remove_orphaned_caches()
  _compilation_cache = tempfile.mkdtemp(prefix=f'{_CACHE_PREFIX}{os.getpid()}-')
  os.environ['LINEN_NNX_KIT_TESTS_XLA_CACHE'] = _compilation_cache
  atexit.register(shutil.rmtree, _compilation_cache, ignore_errors=True)
# Set in the environment too, so the processes tests start (the pages'
# commands, `linen-nnx` runs, multi-process jobs) read and fill it as well.
_cache_settings = {
    'jax_compilation_cache_dir': _compilation_cache,
    'jax_persistent_cache_min_compile_time_secs': 0,
    'jax_persistent_cache_min_entry_size_bytes': 0,
}
for _name, _value in _cache_settings.items():
  os.environ[_name.upper()] = str(_value)
  jax.config.update(_name, _value)

# The kit's FSDP SGD is registered with the converters as a user registers an
# optimizer of their own; many tests convert its state.
from linen_nnx_cli import kit_models  # noqa: E402, F401
from tests import hypothesis_profiles  # noqa: E402, F401  (loads the profile)


#: Parametrized tests whose cases differ in configuration (layouts, meshes,
#: optimizers, model kinds), not in what they check: CI runs every n-th case
#: (the first, then every n-th in collection order), `make nightly` them all.
CI_EVERY_NTH = {
    # The LSTM's fused cell from a msgpack directory: the others of that format and Orbax's, nightly.
    'tests/converters/checkpoint/test_models.py::test_flax_training_checkpoints_of_every_pair_convert': 4,
    'tests/converters/checkpoint/test_weights.py::'
    'test_linen_weights_convert_to_nnx_restore_with_its_own_code_and_come_back': 6,
    'tests/converters/test_api.py::test_linen_k_steps_then_nnx_j_steps_equal_linen_k_plus_j': 12,
    'tests/converters/test_api.py::test_nnx_k_steps_then_linen_j_steps_equal_nnx_k_plus_j': 3,
    'tests/converters/port/test_generate.py::test_ports_are_proven_at_the_traced_and_another_configuration': 3,
    'tests/converters/testing/test_port.py::test_where_dropout_acts_is_compared_by_its_effect_in_a_training_step': 3,
    # One mechanism for both transforms (a setting in every trace-cache key): CI takes nnx.remat's.
    'tests/converters/testing/test_port.py::test_a_transformed_method_traced_again_from_jaxs_cache_draws_in_order': 2,
    'tests/converters/testing/test_port.py::test_two_calls_of_one_transformed_method_in_a_call_draw_in_order': 2,
    'tests/converters/testing/test_port.py::test_a_port_drawing_in_another_order_through_a_transformed_method_fails': 2,
    'tests/converters/testing/test_port.py::'
    'test_a_scanned_remat_port_is_equal_bit_for_bit_whatever_its_program_returns': 3,
    # Every 7th of MATRIX's 16 (the kit MLP's sharding claims, each case cached across its tests):
    # 2x4 looped on device axes, 1x8 scanned under FSDP rules, 4x2 scanned on device axes.
    'tests/linen_impl/test_train.py::test_every_param_and_moment_is_sharded_as_annotated': 7,
    'tests/linen_impl/test_train.py::test_output_is_sharded_data_none': 7,
    'tests/linen_impl/test_train.py::test_activations_are_constrained_as_annotated': 7,
    'tests/nnx_impl/test_train.py::test_output_is_sharded_data_none': 7,
    # The same cases as `test_output_is_sharded_data_none`: their runs are cached.
    'tests/linen_impl/test_train.py::test_scanned_steps_equal_single_steps': 7,
    'tests/nnx_impl/test_train.py::test_scanned_steps_equal_single_steps': 7,
    'tests/nnx_impl/test_train.py::test_activations_are_constrained_as_annotated': 7,
    'tests/linen_impl/test_train.py::test_creation_never_materialises_a_whole_array_on_one_device': 7,
    'tests/linen_impl/test_train.py::test_bfloat16_params_train_and_scan_like_single_steps': 3,
    'tests/linen_impl/test_checkpoint.py::test_restore_is_bit_identical_and_sharded_alike': 6,
    'tests/nnx_impl/test_train.py::test_every_param_and_moment_is_sharded_as_annotated': 7,
    'tests/nnx_impl/test_train.py::test_creation_never_materialises_a_whole_array_on_one_device': 7,
    'tests/nnx_impl/test_train.py::test_bfloat16_params_train_and_scan_like_single_steps': 3,
    'tests/nnx_impl/test_checkpoint.py::test_restore_is_bit_identical_and_sharded_alike': 6,
    'tests/linen_nnx_cli/test_kit_models.py::test_describe_reads_layout_size_and_optimizer': 5,
    'tests/linen_nnx_cli/test_main_checkpoints.py::test_sigkill_leaves_src_intact_and_dst_absent_or_complete': 2,
    'tests/linen_nnx_cli/test_user_models.py::test_sigkill_leaves_src_intact_and_dst_absent_or_complete': 5,
    'tests/converters/inference/test_wrong_pairs.py::test_a_port_maps_correctly_or_is_refused_never_wrong': 3,
    'tests/converters/inference/test_infer.py::test_a_model_that_scans_maps_to_a_port_that_loops': 3,
    'tests/converters/inference/test_infer.py::'
    'test_both_layouts_merge_into_the_hand_written_rules_with_their_stacked_paths': 3,
    'tests/converters/inference/test_infer.py::test_a_norm_written_by_hand_maps_onto_flaxs': 2,
    # CI: the unstacked source to a partitioned scan; a partitioned source is read in CI by
    # test_main_checkpoints.py::test_layout_change_with_a_layer_partition.
    'tests/converters/checkpoint/test_convert.py::test_layer_partition_names_the_stacked_axis_of_the_scanned_side': 3,
    'tests/converters/inference/test_infer.py::test_operands_that_commute_do_not_tell_variables_apart': 3,
    'tests/converters/inference/test_infer.py::test_every_zoo_pair_infers_the_hand_written_mapping': 2,
    'tests/converters/inference/test_infer.py::test_a_contraction_written_kernel_first_is_never_given_a_transpose': 2,
    'tests/converters/test_equivalence.py::test_corrupted_trees_convert_exactly_or_raise_an_error_naming_the_path': 7,
    'tests/converters/checkpoint/test_hostile_models.py::'
    'test_state_only_the_port_has_converts_both_ways_and_compares_with_a_one_sided_rule': 2,
    'tests/converters/checkpoint/test_compare.py::'
    'test_keyword_inputs_are_inputs_of_both_models_made_generic_like_positional_ones': 2,
    # ResNet, as a model and as a pure dict: the transformer's, nightly (test_weights.py says why).
    'tests/converters/checkpoint/test_weights.py::test_nnx_weights_convert_to_linen_and_restore_with_its_own_code': 3,
    'tests/converters/test_zoo_ports.py::'
    'test_a_decode_cache_converted_after_three_tokens_decodes_the_next_three_alike': 3,
    'tests/linen_impl/test_train.py::test_training_lowers_the_loss': 4,
    # adamw's moments are adam's: CI takes adam and fsdp_sgd (one trace).
    'tests/linen_impl/test_train.py::test_optimizer_state_is_sharded_as_annotated': 3,
    'tests/nnx_impl/test_train.py::test_optimizer_state_is_sharded_as_annotated': 3,
    'tests/converters/test_equivalence.py::test_scanned_and_looped_models_with_the_same_params_agree': 4,
    'tests/converters/test_placement.py::'
    'test_flax_lm1b_initialised_unsharded_converts_into_its_nnx_ports_sharded_target': 2,
    'tests/converters/test_zoo_ports.py::test_resnet_train_state_with_batch_stats_trains_on_in_nnx_exactly': 2,
    'tests/converters/test_zoo_ports.py::test_lstm_trains_on_in_the_fused_cell_exactly': 2,
    # The three MATRIX cases the impls check every parameter of in CI (0, 7, 14): their runs are cached.
    'tests/test_side_by_side_layouts.py::test_linen_and_nnx_give_the_same_partition_specs': 7,
    'tests/nnx_impl/test_train.py::test_training_lowers_the_loss': 3,
}


@pytest.hookimpl(tryfirst=True)  # before `-m property` / `-m 'not nightly'` select by them
def pytest_collection_modifyitems(config, items):
  seen: dict[str, int] = {}
  for item in items:
    if is_hypothesis_test(getattr(item, 'obj', None)):
      item.add_marker(pytest.mark.property)
    function = item.nodeid.split('[', 1)[0]
    if function in CI_EVERY_NTH and '[' in item.nodeid:
      k = seen[function] = seen.get(function, -1) + 1
      if k % CI_EVERY_NTH[function]:
        item.add_marker(pytest.mark.nightly)


def pytest_configure(config):
  if os.environ.get('TEST_SHARD'):
    config.pluginmanager.register(_Shard(os.environ['TEST_SHARD']), 'test-shard')


class _Shard:
  """Keeps the k-th of n shares of the tests selected (`TEST_SHARD=k/n`)."""

  def __init__(self, shard: str):
    try:
      self.k, self.n = (int(x) for x in shard.split('/'))
      assert 1 <= self.k <= self.n
    except (ValueError, AssertionError):
      raise pytest.UsageError(f'TEST_SHARD={shard!r}: write k/n with 1 <= k <= n, e.g. 1/4') from None

  @pytest.hookimpl(trylast=True)  # after `-m` and `-k` select
  def pytest_collection_modifyitems(self, config, items):
    # Every process collects the same items in the same order: shares agree.
    mine = [i % self.n == self.k - 1 for i in range(len(items))]
    config.hook.pytest_deselected(items=[item for item, m in zip(items, mine) if not m])
    items[:] = [item for item, m in zip(items, mine) if m]
