"""`converters.port.training`: a checkpoint of the Linen model, converted by
`linen-nnx convert --paths <port>_paths:PATHS`, restored into the written port,
and training goes on as in Linen.

Each test converts with the command in a process of its own (as the test
file a port writes does in the user's CI); the zoo's and Flax's models run
it nightly, through the test files their ports write
(`test_generate.py`).
"""

from __future__ import annotations

import pathlib

import pytest

from converters.port import assert_checkpoint_trains_on
from converters.port.prove import paths_file
from tests.converters.port import linen_models
from tests.converters.port.test_generate import FACTORIES, _pinned

FACTORY = f'{FACTORIES}:batch_normed'


@pytest.fixture(scope='module')
def port_file(tmp_path_factory):
  """The port of a model with batch statistics and dropout, as written (the
  text a nightly run proves, `PINNED`)."""
  _, out = _pinned(tmp_path_factory.mktemp('batch_normed'), 'batch_normed')
  return out


def test_a_converted_checkpoint_trains_on_as_in_linen(port_file, tmp_path):
  assert_checkpoint_trains_on(linen_models.batch_normed(), str(port_file), str(tmp_path), factory=FACTORY,
                              modes={'train': True})


def _planted(port_file, tmp_path, paths_text: str):
  """A copy of the port beside a mapping of our own."""
  planted = tmp_path / 'planted' / 'batch_normed_nnx.py'
  planted.parent.mkdir()
  planted.write_text(port_file.read_text())
  pathlib.Path(paths_file(str(planted))).write_text(paths_text)
  return planted


def test_a_mapping_that_swaps_two_parameters_of_one_shape_fails(port_file, tmp_path):
  # The conversion and the comparison of states both read PATHS: the
  # swap shows in the training that follows and in the final outputs.
  text = pathlib.Path(paths_file(str(port_file))).read_text()
  scale = "PathRule('BatchNorm_0/scale', 'batch_norm/scale')"
  bias = "PathRule('BatchNorm_0/bias', 'batch_norm/bias')"
  assert scale in text and bias in text
  swapped = text.replace(scale, '@').replace(bias, "PathRule('BatchNorm_0/bias', 'batch_norm/scale')").replace(
      '@', "PathRule('BatchNorm_0/scale', 'batch_norm/bias')")
  planted = _planted(port_file, tmp_path, swapped)
  with pytest.raises(AssertionError, match='NNX steps differ'):
    assert_checkpoint_trains_on(linen_models.batch_normed(), str(planted), str(tmp_path / 'run'),
                                factory=FACTORY, modes={'train': True})


@pytest.mark.nightly  # CI: checkpoint/test_models.py::test_a_missing_rule_is_named_on_both_sides_before_reading, test_a_mapping_that_swaps_two_parameters_of_one_shape_fails
def test_a_mapping_the_command_refuses_fails_with_its_reason(port_file, tmp_path):
  text = pathlib.Path(paths_file(str(port_file))).read_text()
  row = "    PathRule('Dense_1/kernel', 'dense_1/kernel'),\n"
  assert row in text
  planted = _planted(port_file, tmp_path, text.replace(row, ''))
  with pytest.raises(AssertionError, match=r'linen-nnx convert failed \(exit 2\).*Dense_1/kernel'):
    assert_checkpoint_trains_on(linen_models.batch_normed(), str(planted), str(tmp_path / 'run'),
                                factory=FACTORY, modes={'train': True})
