"""How the Linen variables of `tests.converters.port.golden.keyword_inputs` map
onto the NNX port `keyword_inputs_nnx` (`linen-nnx convert --paths
keyword_inputs_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.keyword_inputs:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Block_0/Dense_0/bias', 'block/dense/bias'),
    PathRule('Block_0/Dense_0/kernel', 'block/dense/kernel'),
    PathRule('Block_0/LayerNorm_0/bias', 'block/layer_norm/bias'),
    PathRule('Block_0/LayerNorm_0/scale', 'block/layer_norm/scale'),
    PathRule('CheckpointDense_0/bias', 'checkpoint_dense/bias'),
    PathRule('CheckpointDense_0/kernel', 'checkpoint_dense/kernel'),
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
])
