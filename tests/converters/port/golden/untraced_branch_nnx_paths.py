"""How the Linen variables of `tests.converters.port.golden.untraced_branch` map
onto the NNX port `untraced_branch_nnx` (`linen-nnx convert --paths
untraced_branch_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.untraced_branch:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Conv_0/bias', 'conv/bias'),
    PathRule('Conv_0/kernel', 'conv/kernel'),
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
])
