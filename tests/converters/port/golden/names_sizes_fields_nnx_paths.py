"""How the Linen variables of `tests.converters.port.golden.names_sizes_fields`
map onto the NNX port `names_sizes_fields_nnx` (`linen-nnx convert --paths
names_sizes_fields_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.names_sizes_fields:model`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/bias', 'dense_1/bias'),
    PathRule('Dense_1/kernel', 'dense_1/kernel'),
    PathRule('Stem_0/Conv_0/bias', 'stem/conv/bias'),
    PathRule('Stem_0/Conv_0/kernel', 'stem/conv/kernel'),
])
