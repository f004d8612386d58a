"""How the Linen variables of `tests.converters.port.golden.scanned_remat_local`
map onto the NNX port `scanned_remat_local_nnx` (`linen-nnx convert --paths
scanned_remat_local_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.scanned_remat_local:model`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('encoder_norm/bias', 'encoder_norm/bias'),
    PathRule('encoder_norm/scale', 'encoder_norm/scale'),
    PathRule('encoderblock/Dense_0/bias', 'encoderblock/dense/bias'),
    PathRule('encoderblock/Dense_0/kernel', 'encoderblock/dense/kernel'),
    PathRule('encoderblock/LayerNorm_0/bias', 'encoderblock/layer_norm/bias'),
    PathRule('encoderblock/LayerNorm_0/scale', 'encoderblock/layer_norm/scale'),
])
