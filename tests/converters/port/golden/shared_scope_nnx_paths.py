"""How the Linen variables of `tests.converters.port.golden.shared_scope` map onto
the NNX port `shared_scope_nnx` (`linen-nnx convert --paths
shared_scope_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.shared_scope:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('mixer/q/w', 'mixer/q/w'),
    PathRule('mlp/gating_einsum', 'mlp/gating/gating_einsum'),
    PathRule('mlp/linear', 'mlp/linear/linear'),
    PathRule('post_norm/bias', 'post_norm/bias'),
    PathRule('post_norm/scale', 'post_norm/scale'),
])
