"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `residual_denoiser_nnx` (`linen-nnx convert --paths
residual_denoiser_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.linen_models:residual_denoiser`. Kept apart from the
port, which imports only Flax, JAX and your own modules; this file is the kit's
to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Conv_0/bias', 'conv_0/bias'),
    PathRule('Conv_0/kernel', 'conv_0/kernel'),
    PathRule('Conv_{i+1}/bias', 'convs/{i}/bias'),
    PathRule('Conv_{i+1}/kernel', 'convs/{i}/kernel'),
    PathRule('Conv_{n}/bias', 'conv_2/bias'),
    PathRule('Conv_{n}/kernel', 'conv_2/kernel'),
])
