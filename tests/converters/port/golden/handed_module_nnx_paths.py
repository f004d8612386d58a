"""How the Linen variables of `tests.converters.port.golden.handed_module` map
onto the NNX port `handed_module_nnx` (`linen-nnx convert --paths
handed_module_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.handed_module:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
    PathRule('pos_embedding', 'pos_embedding'),
    PathRule('scale', 'scale'),
])
