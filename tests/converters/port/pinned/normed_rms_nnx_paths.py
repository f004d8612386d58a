"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `normed_rms_nnx` (`linen-nnx convert --paths
normed_rms_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:normed_rms`. Kept apart from the port, which
imports only Flax, JAX and your own modules; this file is the kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/kernel', 'dense_1/kernel'),
    PathRule('post_norm/scale', 'post_norm/scale'),
    PathRule('pre_norm/scale', 'pre_norm/scale'),
])
