"""How the Linen variables of `tests.converters.port.golden.class_token` map onto
the NNX port `class_token_nnx` (`linen-nnx convert --paths
class_token_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.class_token:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
    PathRule('Encoder_0/Dense_0/bias', 'encoder/dense/bias'),
    PathRule('Encoder_0/Dense_0/kernel', 'encoder/dense/kernel'),
    PathRule('Encoder_0/pos_embedding', 'encoder/pos_embedding'),
    PathRule('cls', 'cls'),
])
