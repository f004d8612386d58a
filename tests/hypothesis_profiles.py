"""Hypothesis settings profiles of the test suite, and the settings of costly properties.

Profiles: `ci` (default: small and derandomized, so every CI run sees the
same examples) and `nightly` (at least 200 random examples per property),
chosen with `HYPOTHESIS_PROFILE=nightly`.

`compiling` is for properties whose every example builds models of a shape of
its own, so XLA compiles both frameworks' programs anew (seconds an example):
`ci` runs a sixth of its examples for them (one: derandomized, hypothesis's
simplest, the smallest model the strategy makes), besides their pinned
`@example`s (the regressions found and the configurations that matter);
`nightly` runs its full count, which is where these properties explore.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILE = os.environ.get('HYPOTHESIS_PROFILE', 'ci')

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
settings.load_profile(PROFILE)

compiling = settings(
    max_examples=settings.get_profile(PROFILE).max_examples // (6 if PROFILE == 'ci' else 1),
)

#: `compiling`, for properties whose pinned `@example`s already span what they
#: claim (meshes, layouts, annotation kinds, the regressions found): `ci` runs
#: those alone, no drawn example; `nightly` draws its full count.
pinned = settings(compiling, phases=(Phase.explicit,)) if PROFILE == 'ci' else compiling
