"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `batch_normed_nnx` (`linen-nnx convert --paths
batch_normed_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:batch_normed`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('BatchNorm_0/mean', 'batch_norm/mean'),
    PathRule('BatchNorm_0/var', 'batch_norm/var'),
    PathRule('BatchNorm_0/bias', 'batch_norm/bias'),
    PathRule('BatchNorm_0/scale', 'batch_norm/scale'),
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/bias', 'dense_1/bias'),
    PathRule('Dense_1/kernel', 'dense_1/kernel'),
])
