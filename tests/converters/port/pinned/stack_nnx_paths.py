"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `stack_nnx` (`linen-nnx convert --paths stack_nnx_paths:PATHS`),
written by `linen-nnx port tests.converters.port.linen_models:stack`. Kept
apart from the port, which imports only Flax, JAX and your own modules; this
file is the kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_{i}/bias', 'denses/{i}/bias'),
    PathRule('Dense_{i}/kernel', 'denses/{i}/kernel'),
    PathRule('head/kernel', 'head/kernel'),
    PathRule('norm/bias', 'norm/bias'),
    PathRule('norm/scale', 'norm/scale'),
])
