"""How the suite's processes compile: XLA options that make compiling cheaper,
set before JAX loads (`tests/conftest.py`), and what a test may read of them.

Compiling is most of the suite's time, and the models are tiny, so the
machine code's speed costs nothing. `make test` compiles with each option
below unless `XLA_FLAGS` already names it; `make nightly` names XLA's
defaults, so it compiles as users do. Subprocesses inherit `XLA_FLAGS`.
"""

from __future__ import annotations

import os

#: Each option `make test` sets, with its value and why:
#: - LLVM at optimisation level 0 (XLA's default is 3): programs compile in
#:   about 60% of the time (a whole run: 848 s of CPU against 1197 s).
#: - Fusions emitted by XLA's older LLVM IR emitters, not its MLIR fusion
#:   emitters (the default on CPU since jaxlib 0.5): another third off
#:   (a whole run: 853 s of CPU against 1265 s). XLA means to remove the
#:   older emitters (openxla/xla#48001); when a jaxlib no longer knows the
#:   flag, XLA refuses to start and every test fails: drop it here then.
FAST = {
    '--xla_backend_optimization_level': '0',
    '--xla_cpu_use_fusion_emitters': 'false',
}


def _given(flags: str) -> dict[str, str]:
  """`--name=value` options of an `XLA_FLAGS` string, by name."""
  return dict(f.split('=', 1) if '=' in f else (f, 'true') for f in flags.split())


def set_fast() -> None:
  """Adds to `XLA_FLAGS` each of `FAST` it does not name (before JAX loads)."""
  given = _given(os.environ.get('XLA_FLAGS', ''))
  added = [f'{name}={value}' for name, value in FAST.items() if name not in given]
  os.environ['XLA_FLAGS'] = ' '.join([os.environ.get('XLA_FLAGS', '')] + added).strip()


def legacy_fusion_emitters() -> bool:
  """Whether this process compiles fusions with XLA's older emitters."""
  return _given(os.environ.get('XLA_FLAGS', '')).get('--xla_cpu_use_fusion_emitters') == 'false'
