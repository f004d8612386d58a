"""Simulated CPU devices, set up before JAX is imported.

XLA reads `--xla_force_host_platform_device_count` once, when the CPU backend
starts, so tests, benchmarks and the command line call `simulate_cpu_devices`
before their first `import jax`.
"""

from __future__ import annotations

import os
import re
import sys

_FLAG = '--xla_force_host_platform_device_count'


def simulate_cpu_devices(count: int) -> None:
  """Makes the CPU backend expose `count` devices.

  Raises:
    RuntimeError: if JAX's backends are already initialised with another
      device count, when the flag can no longer take effect.
  """
  if count < 1:
    raise ValueError(f'device count must be >= 1, got {count}')
  if 'jax' in sys.modules:
    import jax

    from converters import compat

    if compat.backends_are_initialized():
      if jax.device_count() == count:
        return
      raise RuntimeError(
          f'JAX already runs with {jax.device_count()} devices; call '
          'simulate_cpu_devices before the first use of jax'
      )
  flags = re.sub(rf'{_FLAG}=\S+', '', os.environ.get('XLA_FLAGS', '')).split()
  os.environ['XLA_FLAGS'] = ' '.join(flags + [f'{_FLAG}={count}'])
