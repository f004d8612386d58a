"""How the Linen variables of `tests.converters.port.golden.chosen_arguments` map
onto the NNX port `chosen_arguments_nnx` (`linen-nnx convert --paths
chosen_arguments_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.chosen_arguments:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('head/bias', 'head/bias'),
    PathRule('head/kernel', 'head/kernel'),
    PathRule('pre_logits/bias', 'pre_logits/bias'),
    PathRule('pre_logits/kernel', 'pre_logits/kernel'),
])
