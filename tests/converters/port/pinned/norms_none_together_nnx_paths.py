"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `norms_none_together_nnx` (`linen-nnx convert --paths
norms_none_together_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:norms_none_together`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('post/bias', 'post/bias'),
    PathRule('post/scale', 'post/scale'),
    PathRule('pre/bias', 'pre/bias'),
    PathRule('pre/scale', 'pre/scale'),
    PathRule('scale/bias', 'scale/bias'),
    PathRule('scale/kernel', 'scale/kernel'),
    PathRule('shift/bias', 'shift/bias'),
    PathRule('shift/kernel', 'shift/kernel'),
])
