"""How the Linen variables of `tests.converters.port.golden.optional_layer` map
onto the NNX port `optional_layer_nnx` (`linen-nnx convert --paths
optional_layer_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.optional_layer:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('embedding/bias', 'embedding/bias'),
    PathRule('embedding/kernel', 'embedding/kernel'),
    PathRule('head/bias', 'head/bias'),
    PathRule('head/kernel', 'head/kernel'),
    PathRule('pre_logits/bias', 'pre_logits/bias'),
    PathRule('pre_logits/kernel', 'pre_logits/kernel'),
])
