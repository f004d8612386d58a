"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `flag_named_as_a_mode_nnx` (`linen-nnx convert --paths
flag_named_as_a_mode_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:flag_named_as_a_mode`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
])
