"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `named_counters_nnx` (`linen-nnx convert --paths
named_counters_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:named_counters`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('NamedCounter_0/a', 'named_counter_0/a'),
    PathRule('NamedCounter_1/b', 'named_counter_1/b'),
    PathRule('NamedCounter_0/Dense_0/bias', 'named_counter_0/dense/bias'),
    PathRule('NamedCounter_0/Dense_0/kernel', 'named_counter_0/dense/kernel'),
    PathRule('NamedCounter_1/Dense_0/bias', 'named_counter_1/dense/bias'),
    PathRule('NamedCounter_1/Dense_0/kernel', 'named_counter_1/dense/kernel'),
])
