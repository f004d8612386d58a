"""Test set-up: 8 simulated CPU devices before JAX loads, hypothesis profiles.

Profiles: `ci` (default: small and derandomized, so every CI run sees the
same examples) and `nightly` (at least 200 random examples per property),
chosen with `HYPOTHESIS_PROFILE=nightly`.
"""

import os

from linen_nnx_cli.devices import simulate_cpu_devices

if os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
  simulate_cpu_devices(8)

from hypothesis import HealthCheck, settings  # noqa: E402

# The kit's FSDP SGD is registered with the converters as a user registers an
# optimizer of their own; many tests convert its state.
from converters.checkpoint import kit  # noqa: E402, F401

settings.register_profile(
    'ci',
    max_examples=6,
    deadline=None,
    # The same examples on every CI run: a red CI means a change broke
    # something, not that a new example turned up. `nightly` explores.
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    'nightly',
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'ci'))
