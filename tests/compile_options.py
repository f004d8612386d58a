"""How the suite's processes compile: XLA options that make compiling
cheaper, added to `XLA_FLAGS` before JAX loads (`tests/conftest.py`), and
what a test may read of them.

Compiling is most of the suite's time and the models are tiny, so slower
machine code costs nothing. `make test` compiles with each option of
`CHEAP` that `XLA_FLAGS` does not name; `make nightly` names XLA's
defaults, so it runs every test as users compile. Processes a test starts
inherit `XLA_FLAGS`.
"""

from __future__ import annotations

import os

#: The options `make test` adds, with their values:
#: - LLVM at optimisation level 0 (XLA's default is 3): programs compile in
#:   about 60% of the time.
#: - Fusions emitted by XLA's older LLVM IR emitters, not its MLIR fusion
#:   emitters (the CPU default of jaxlib 0.10): about two thirds of the
#:   time again (`testing/test_port.py` alone, both at level 0: 56.6 s of
#:   CPU against 80.3 s). XLA is retiring the older emitters (openxla/xla
#:   pull request 48001 removes the elemental emitter route); a jaxlib that
#:   no longer knows this flag refuses to start, and every test fails: drop
#:   the option here then.
CHEAP = {
    '--xla_backend_optimization_level': '0',
    '--xla_cpu_use_fusion_emitters': 'false',
}


def given_options(flags: str) -> dict[str, str]:
  """The options of an `XLA_FLAGS` string by name, the last value of a name
  given twice, as XLA reads them (`--name` alone is `--name=true`; a quoted
  value holding spaces is not read whole, and none of `CHEAP` takes one)."""
  return dict(f.split('=', 1) if '=' in f else (f, 'true') for f in flags.split())


def add_cheap() -> None:
  """Adds to `XLA_FLAGS` each option of `CHEAP` it does not name."""
  flags = os.environ.get('XLA_FLAGS', '')
  given = given_options(flags)
  added = [f'{name}={value}' for name, value in CHEAP.items() if name not in given]
  os.environ['XLA_FLAGS'] = ' '.join([flags] + added).strip()


def _same_value(a: str, b: str) -> bool:
  """Whether two values of an option are one value to XLA (`false`, `False`
  and `0` are one boolean; `0` and `00` one integer)."""
  booleans = {'true': True, '1': True, 'false': False, '0': False}
  if a.lower() in booleans and b.lower() in booleans:
    return booleans[a.lower()] == booleans[b.lower()]
  try:
    return int(a) == int(b)
  except ValueError:
    return a == b


def all_cheap() -> bool:
  """Whether this process compiles with every option of `CHEAP`."""
  given = given_options(os.environ.get('XLA_FLAGS', ''))
  return all(name in given and _same_value(given[name], value) for name, value in CHEAP.items())
