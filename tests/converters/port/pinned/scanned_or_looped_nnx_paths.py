"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `scanned_or_looped_nnx` (`linen-nnx convert --paths
scanned_or_looped_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:scanned_or_looped`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
    PathRule('ResidualLayer_{i}/Dense_0/bias', 'layers/{i}/dense_0/bias'),
    PathRule('ResidualLayer_{i}/Dense_0/kernel', 'layers/{i}/dense_0/kernel'),
    PathRule('ResidualLayer_{i}/Dense_1/bias', 'layers/{i}/dense_1/bias'),
    PathRule('ResidualLayer_{i}/Dense_1/kernel', 'layers/{i}/dense_1/kernel'),
    PathRule('ResidualLayer_{i}/LayerNorm_0/bias', 'layers/{i}/layer_norm/bias'),
    PathRule('ResidualLayer_{i}/LayerNorm_0/scale', 'layers/{i}/layer_norm/scale'),
    PathRule('ScanCheckpointResidualLayer_0/Dense_0/bias', 'layers/dense_0/bias'),
    PathRule('ScanCheckpointResidualLayer_0/Dense_0/kernel', 'layers/dense_0/kernel'),
    PathRule('ScanCheckpointResidualLayer_0/Dense_1/bias', 'layers/dense_1/bias'),
    PathRule('ScanCheckpointResidualLayer_0/Dense_1/kernel', 'layers/dense_1/kernel'),
    PathRule('ScanCheckpointResidualLayer_0/LayerNorm_0/bias', 'layers/layer_norm/bias'),
    PathRule('ScanCheckpointResidualLayer_0/LayerNorm_0/scale', 'layers/layer_norm/scale'),
])
