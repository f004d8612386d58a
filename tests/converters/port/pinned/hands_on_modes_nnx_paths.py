"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `hands_on_modes_nnx` (`linen-nnx convert --paths
hands_on_modes_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:hands_on_modes`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('inner/Dense_0/bias', 'inner/dense/bias'),
    PathRule('inner/Dense_0/kernel', 'inner/dense/kernel'),
    PathRule('out/bias', 'out/bias'),
    PathRule('out/kernel', 'out/kernel'),
])
