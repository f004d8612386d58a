"""How the Linen variables of `tests.converters.port.golden.shared_module` map
onto the NNX port `shared_module_nnx` (`linen-nnx convert --paths
shared_module_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.shared_module:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('decoder/logits/bias', 'decoder/logits/bias'),
    PathRule('decoder/logits/kernel', 'decoder/logits/kernel'),
    PathRule('encoder/out/bias', 'encoder/out/bias'),
    PathRule('encoder/out/kernel', 'encoder/out/kernel'),
    PathRule('shared_embedding/embedding', 'decoder/shared_embedding/embedding'),
    PathRule('decoder/embed/embedding', 'decoder/embed/embedding'),
    PathRule('encoder/embed/embedding', 'encoder/embed/embedding'),
])
