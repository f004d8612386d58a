"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `layer_from_partial_field_nnx` (`linen-nnx convert --paths
layer_from_partial_field_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:layer_from_partial_field`. Kept apart from
the port, which imports only Flax, JAX and your own modules; this file is the
kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'dense/kernel'),
])
