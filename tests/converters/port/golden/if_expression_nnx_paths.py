"""How the Linen variables of `tests.converters.port.golden.if_expression` map
onto the NNX port `if_expression_nnx` (`linen-nnx convert --paths
if_expression_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.if_expression:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Block_0/Dense_0/bias', 'block_0/dense/bias'),
    PathRule('Block_0/Dense_0/kernel', 'block_0/dense/kernel'),
    PathRule('Block_1/Dense_0/bias', 'block_1/dense/bias'),
    PathRule('Block_1/Dense_0/kernel', 'block_1/dense/kernel'),
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/bias', 'dense_1/bias'),
    PathRule('Dense_1/kernel', 'dense_1/kernel'),
])
