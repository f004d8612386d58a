"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `two_pools_nnx` (`linen-nnx convert --paths
two_pools_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:two_pools`. Kept apart from the port, which
imports only Flax, JAX and your own modules; this file is the kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('TokenPool_0/Dense_0/bias', 'token_pool_0/dense/bias'),
    PathRule('TokenPool_0/Dense_0/kernel', 'token_pool_0/dense/kernel'),
    PathRule('TokenPool_1/Dense_0/bias', 'token_pool_1/dense/bias'),
    PathRule('TokenPool_1/Dense_0/kernel', 'token_pool_1/dense/kernel'),
    PathRule('TokenPool_1/cls', 'token_pool_1/cls'),
])
