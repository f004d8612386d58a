"""Test set-up: 8 simulated CPU devices before JAX loads, one compilation per
program, hypothesis profiles (`tests.hypothesis_profiles`), and the
`property` marker on every hypothesis property (`make nightly` runs them;
`TEST_SHARD=k/n` keeps the k-th of n shares of the tests collected).

Every distinct XLA program is compiled once per session: JAX's persistent
compilation cache, in a directory of the session's own that both test
processes share and that is removed at exit. Tests build the same models
again and again (each parametrization, each hypothesis example, each side
of a comparison), and compiling them is most of the suite's time; the executables are those XLA builds anyway, so bit-for-bit
comparisons are unaffected.
"""

import os

from linen_nnx_cli.devices import simulate_cpu_devices

if os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
  simulate_cpu_devices(8)
  # XLA's LLVM backend at optimisation level 0 unless told otherwise
  # (`make nightly` runs the default): machine code that runs slower but compiles
  # in about 60% of the time, and compiling is most of the suite's time.
  if '--xla_backend_optimization_level' not in os.environ['XLA_FLAGS']:
    os.environ['XLA_FLAGS'] += ' --xla_backend_optimization_level=0'

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import is_hypothesis_test  # noqa: E402

# One cache for the session's processes: the first (pytest, or xdist's
# controller) makes it and removes it at exit; the workers it starts inherit
# its path, so a program one worker compiled serves the other.
_compilation_cache = os.environ.get('LINEN_NNX_KIT_TESTS_XLA_CACHE')
if _compilation_cache is None:
  _compilation_cache = tempfile.mkdtemp(prefix='linen-nnx-kit-tests-xla-')
  os.environ['LINEN_NNX_KIT_TESTS_XLA_CACHE'] = _compilation_cache
  atexit.register(shutil.rmtree, _compilation_cache, ignore_errors=True)
jax.config.update('jax_compilation_cache_dir', _compilation_cache)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)

# The kit's FSDP SGD is registered with the converters as a user registers an
# optimizer of their own; many tests convert its state.
from linen_nnx_cli import kit_models  # noqa: E402, F401
from tests import hypothesis_profiles  # noqa: E402, F401  (loads the profile)


@pytest.hookimpl(tryfirst=True)  # before `-m property` selects by it
def pytest_collection_modifyitems(config, items):
  for item in items:
    if is_hypothesis_test(getattr(item, 'obj', None)):
      item.add_marker(pytest.mark.property)


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
