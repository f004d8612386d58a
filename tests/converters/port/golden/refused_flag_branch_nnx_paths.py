"""How the Linen variables of `tests.converters.port.golden.refused_flag_branch`
map onto the NNX port `refused_flag_branch_nnx` (`linen-nnx convert --paths
refused_flag_branch_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.refused_flag_branch:model`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('block_{i}/Dense_0/bias', 'blocks/{i}/dense/bias'),
    PathRule('block_{i}/Dense_0/kernel', 'blocks/{i}/dense/kernel'),
    PathRule('norm/bias', 'norm/bias'),
    PathRule('norm/scale', 'norm/scale'),
])
