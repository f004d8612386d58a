"""How the Linen variables of `tests.converters.port.golden.named_by_fields` map
onto the NNX port `named_by_fields_nnx` (`linen-nnx convert --paths
named_by_fields_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.named_by_fields:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('embedder/input_embedding', 'embedder/input_embedding_table'),
    PathRule('layer_{i}/Einsum_0/gating', 'blocks/{i}/einsum_0/gating'),
    PathRule('layer_{i}/Einsum_1/w', 'blocks/{i}/einsum_1/w'),
])
