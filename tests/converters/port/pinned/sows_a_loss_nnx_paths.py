"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `sows_a_loss_nnx` (`linen-nnx convert --paths
sows_a_loss_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:sows_a_loss`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/bias', 'dense_1/bias'),
    PathRule('Dense_1/kernel', 'dense_1/kernel'),
])
