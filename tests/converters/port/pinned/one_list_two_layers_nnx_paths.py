"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `one_list_two_layers_nnx` (`linen-nnx convert --paths
one_list_two_layers_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:one_list_two_layers`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('layers_0/bias', 'layers/0/bias'),
    PathRule('layers_0/kernel', 'layers/0/kernel'),
    PathRule('layers_1/bias', 'layers/1/bias'),
    PathRule('layers_1/kernel', 'layers/1/kernel'),
])
