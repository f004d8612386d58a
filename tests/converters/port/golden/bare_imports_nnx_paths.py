"""How the Linen variables of `tests.converters.port.golden.bare_imports` map onto
the NNX port `bare_imports_nnx` (`linen-nnx convert --paths
bare_imports_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.bare_imports:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Block_0/Conv_0/bias', 'block_0/conv_0/bias'),
    PathRule('Block_0/Conv_0/kernel', 'block_0/conv_0/kernel'),
    PathRule('Block_0/LayerNorm_0/bias', 'block_0/layer_norm_0/bias'),
    PathRule('Block_0/LayerNorm_0/scale', 'block_0/layer_norm_0/scale'),
    PathRule('Conv_0/bias', 'conv_0/bias'),
    PathRule('Conv_0/kernel', 'conv_0/kernel'),
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
])
