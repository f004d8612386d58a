"""How the Linen variables of `tests.converters.port.golden._layers,
tests.converters.port.golden.module_attribute` map onto the NNX port
`module_attribute_nnx` (`linen-nnx convert --paths
module_attribute_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.module_attribute:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Block_0/Dense_0/bias', 'block/dense/bias'),
    PathRule('Block_0/Dense_0/kernel', 'block/dense/kernel'),
])
