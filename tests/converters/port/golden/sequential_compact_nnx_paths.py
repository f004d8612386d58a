"""How the Linen variables of `tests.converters.port.golden.sequential_compact`
map onto the NNX port `sequential_compact_nnx` (`linen-nnx convert --paths
sequential_compact_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.sequential_compact:model`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Block_{i}/Dense_0/bias', 'sequentials/{i}/layers/0/dense/bias'),
    PathRule('Block_{i}/Dense_0/kernel', 'sequentials/{i}/layers/0/dense/kernel'),
    PathRule('Block_{i}/LayerNorm_0/bias', 'sequentials/{i}/layers/0/layer_norm/bias'),
    PathRule('Block_{i}/LayerNorm_0/scale', 'sequentials/{i}/layers/0/layer_norm/scale'),
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/bias', 'head/layers/0/bias'),
    PathRule('Dense_1/kernel', 'head/layers/0/kernel'),
    PathRule('Dense_2/bias', 'head/layers/2/bias'),
    PathRule('Dense_2/kernel', 'head/layers/2/kernel'),
])
