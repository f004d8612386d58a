"""How the Linen variables of `tests.converters.port.golden.flag_or_width` map
onto the NNX port `flag_or_width_nnx` (`linen-nnx convert --paths
flag_or_width_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.flag_or_width:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
    PathRule('head/bias', 'head/bias'),
    PathRule('head/kernel', 'head/kernel'),
    PathRule('pre_logits/bias', 'pre_logits/bias'),
    PathRule('pre_logits/kernel', 'pre_logits/kernel'),
])
