"""How the Linen variables of `tests.converters.port.golden.stub_in_a_branch` map
onto the NNX port `stub_in_a_branch_nnx` (`linen-nnx convert --paths
stub_in_a_branch_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.stub_in_a_branch:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

# Left out while classes of the port are stubs: the 3 variables under them
#   PoolingHead_0/Dense_0/bias
#   PoolingHead_0/Dense_0/kernel
#   PoolingHead_0/probe
# Port the stubs, then map the whole model with `linen-nnx map`.
from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_0/bias', 'dense_0/bias'),
    PathRule('Dense_0/kernel', 'dense_0/kernel'),
    PathRule('Dense_1/bias', 'dense_1/bias'),
    PathRule('Dense_1/kernel', 'dense_1/kernel'),
    PathRule('Encoder_0/Dense_{i}/bias', 'encoder/denses/{i}/bias'),
    PathRule('Encoder_0/Dense_{i}/kernel', 'encoder/denses/{i}/kernel'),
    PathRule('Encoder_0/LayerNorm_{i}/bias', 'encoder/layer_norms/{i}/bias'),
    PathRule('Encoder_0/LayerNorm_{i}/scale', 'encoder/layer_norms/{i}/scale'),
])
