"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `merged_flag_nnx` (`linen-nnx convert --paths
merged_flag_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:merged_flag`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
])
