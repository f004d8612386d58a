"""How the Linen variables of
`tests.converters.port.golden.if_expression_in_a_loop` map onto the NNX port
`if_expression_in_a_loop_nnx` (`linen-nnx convert --paths
if_expression_in_a_loop_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.if_expression_in_a_loop:model`. Kept apart from
the port, which imports only Flax, JAX and your own modules; this file is the
kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_{i}/bias', 'denses/{i}/bias'),
    PathRule('Dense_{i}/kernel', 'denses/{i}/kernel'),
])
