"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `loop_between_layers_nnx` (`linen-nnx convert --paths
loop_between_layers_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:loop_between_layers`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_{i+1}/bias', 'denses/{i}/bias'),
    PathRule('Dense_{i+1}/kernel', 'denses/{i}/kernel'),
    PathRule('Dense_{n}/bias', 'dense_3/bias'),
    PathRule('Dense_{n}/kernel', 'dense_3/kernel'),
    PathRule('Dense_{n+1}/bias', 'dense_4/bias'),
    PathRule('Dense_{n+1}/kernel', 'dense_4/kernel'),
])
