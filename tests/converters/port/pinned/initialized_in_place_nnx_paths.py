"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `initialized_in_place_nnx` (`linen-nnx convert --paths
initialized_in_place_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:initialized_in_place`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('b', 'b'),
    PathRule('offset', 'offset'),
    PathRule('scale', 'scale'),
    PathRule('w', 'w'),
])
