"""How the Linen variables of `tests.converters.port.golden.shadowed_names` map
onto the NNX port `shadowed_names_nnx` (`linen-nnx convert --paths
shadowed_names_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.shadowed_names:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/bias', 'dense_1/bias'),
    PathRule('Dense_1/kernel', 'dense_1/kernel'),
])
