"""How the Linen variables of `tests.converters.port.golden.numbered_names` map
onto the NNX port `numbered_names_nnx` (`linen-nnx convert --paths
numbered_names_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.numbered_names:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('block{i+1}/proj/bias', 'blocks/{i}/proj/bias'),
    PathRule('block{i+1}/proj/kernel', 'blocks/{i}/proj/kernel'),
    PathRule('head/bias', 'head/bias'),
    PathRule('head/kernel', 'head/kernel'),
    PathRule('layers_{i}/bias', 'layers/{i}/bias'),
    PathRule('layers_{i}/kernel', 'layers/{i}/kernel'),
    PathRule('stem/bias', 'stem/bias'),
    PathRule('stem/kernel', 'stem/kernel'),
])
