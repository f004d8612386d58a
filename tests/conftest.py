"""Test set-up: 8 simulated CPU devices before JAX loads, one compilation per
program, hypothesis profiles (`tests.hypothesis_profiles`).

Every distinct XLA program is compiled once per session: JAX's persistent
compilation cache, in a directory of the session's own that is removed at
exit. Tests build the same models again and again (each parametrization, each
hypothesis example, each side of a comparison), and compiling them is most of
the suite's time; the executables are those XLA builds anyway, so bit-for-bit
comparisons are unaffected.
"""

import os

from linen_nnx_cli.devices import simulate_cpu_devices

if os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
  simulate_cpu_devices(8)

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402

_compilation_cache = tempfile.mkdtemp(prefix='linen-nnx-kit-tests-xla-')
atexit.register(shutil.rmtree, _compilation_cache, ignore_errors=True)
jax.config.update('jax_compilation_cache_dir', _compilation_cache)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)

# The kit's FSDP SGD is registered with the converters as a user registers an
# optimizer of their own; many tests convert its state.
from converters.checkpoint import kit  # noqa: E402, F401
from tests import hypothesis_profiles  # noqa: E402, F401  (loads the profile)
