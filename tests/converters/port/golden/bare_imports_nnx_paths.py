"""How the Linen variables of `tests.converters.port.golden.bare_imports` map onto
the NNX port `bare_imports_nnx` (`linen-nnx convert --paths
bare_imports_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.bare_imports:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Block_0/Conv_0/bias', 'block/conv/bias'),
    PathRule('Block_0/Conv_0/kernel', 'block/conv/kernel'),
    PathRule('Block_0/LayerNorm_0/bias', 'block/layer_norm/bias'),
    PathRule('Block_0/LayerNorm_0/scale', 'block/layer_norm/scale'),
    PathRule('Conv_0/bias', 'conv/bias'),
    PathRule('Conv_0/kernel', 'conv/kernel'),
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
])
