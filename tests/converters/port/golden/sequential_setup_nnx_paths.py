"""How the Linen variables of `tests.converters.port.golden.sequential_setup` map
onto the NNX port `sequential_setup_nnx` (`linen-nnx convert --paths
sequential_setup_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.sequential_setup:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('body/layers_0/bias', 'body/layers/0/bias'),
    PathRule('body/layers_0/kernel', 'body/layers/0/kernel'),
    PathRule('body/layers_2/bias', 'body/layers/2/bias'),
    PathRule('body/layers_2/kernel', 'body/layers/2/kernel'),
])
