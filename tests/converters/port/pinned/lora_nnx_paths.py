"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `lora_nnx` (`linen-nnx convert --paths lora_nnx_paths:PATHS`), written
by `linen-nnx port tests.converters.port.linen_models:lora`. Kept apart from
the port, which imports only Flax, JAX and your own modules; this file is the
kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('Dense_0/kernel', 'dense/kernel'),
    PathRule('lora/A', 'lora/A'),
    PathRule('lora/B', 'lora/B'),
    PathRule('lora/bias', 'lora/dense/bias'),
    PathRule('lora/kernel', 'lora/dense/kernel'),
])
