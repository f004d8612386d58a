"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `float_fields_nnx` (`linen-nnx convert --paths
float_fields_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:float_fields`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
    PathRule('LayerNorm_0/bias', 'layer_norm/bias'),
    PathRule('LayerNorm_0/scale', 'layer_norm/scale'),
])
