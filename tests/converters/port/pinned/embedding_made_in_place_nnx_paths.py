"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `embedding_made_in_place_nnx` (`linen-nnx convert --paths
embedding_made_in_place_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:embedding_made_in_place`. Kept apart from
the port, which imports only Flax, JAX and your own modules; this file is the
kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Embed_0/embedding', 'embed/embedding'),
    PathRule('EmbeddingUser_0/out/bias', 'embedding_user/out/bias'),
    PathRule('EmbeddingUser_0/out/kernel', 'embedding_user/out/kernel'),
])
