"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `embedding_handed_on_twice_nnx` (`linen-nnx convert --paths
embedding_handed_on_twice_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:embedding_handed_on_twice`. Kept apart from
the port, which imports only Flax, JAX and your own modules; this file is the
kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('outer/user/out/bias', 'outer/user/out/bias'),
    PathRule('outer/user/out/kernel', 'outer/user/out/kernel'),
    PathRule('table/embedding', 'outer/user/emb/embedding'),
])
