"""How the Linen variables of `tests.converters.port.golden.diffusion_idioms` map
onto the NNX port `diffusion_idioms_nnx` (`linen-nnx convert --paths
diffusion_idioms_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.diffusion_idioms:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
    PathRule('Head_0/Dense_0/bias', 'head_0/dense_0/bias'),
    PathRule('Head_0/Dense_0/kernel', 'head_0/dense_0/kernel'),
    PathRule('Head_0/Dense_1/bias', 'head_0/dense_1/bias'),
    PathRule('Head_0/Dense_1/kernel', 'head_0/dense_1/kernel'),
    PathRule('LabelEmbedder_0/Embed_0/embedding', 'label_embedder/embed/embedding'),
    PathRule('table', 'table'),
])
