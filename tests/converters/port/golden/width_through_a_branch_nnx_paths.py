"""How the Linen variables of
`tests.converters.port.golden.width_through_a_branch` map onto the NNX port
`width_through_a_branch_nnx` (`linen-nnx convert --paths
width_through_a_branch_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.width_through_a_branch:model`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('block/bias', 'block/bias'),
    PathRule('block/kernel', 'block/kernel'),
    PathRule('head/bias', 'head/bias'),
    PathRule('head/kernel', 'head/kernel'),
    PathRule('projection/bias', 'projection/bias'),
    PathRule('projection/kernel', 'projection/kernel'),
])
