"""How the Linen variables of `tests.converters.port.golden.cross_attention` map
onto the NNX port `cross_attention_nnx` (`linen-nnx convert --paths
cross_attention_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.cross_attention:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('LayerNorm_0/bias', 'layer_norm/bias'),
    PathRule('LayerNorm_0/scale', 'layer_norm/scale'),
    PathRule('MultiHeadDotProductAttention_0/key/bias', 'multi_head_dot_product_attention/key/bias'),
    PathRule('MultiHeadDotProductAttention_0/key/kernel', 'multi_head_dot_product_attention/key/kernel'),
    PathRule('MultiHeadDotProductAttention_0/out/bias', 'multi_head_dot_product_attention/out/bias'),
    PathRule('MultiHeadDotProductAttention_0/out/kernel', 'multi_head_dot_product_attention/out/kernel'),
    PathRule('MultiHeadDotProductAttention_0/query/bias', 'multi_head_dot_product_attention/query/bias'),
    PathRule('MultiHeadDotProductAttention_0/query/kernel', 'multi_head_dot_product_attention/query/kernel'),
    PathRule('MultiHeadDotProductAttention_0/value/bias', 'multi_head_dot_product_attention/value/bias'),
    PathRule('MultiHeadDotProductAttention_0/value/kernel', 'multi_head_dot_product_attention/value/kernel'),
    PathRule('cross/key/bias', 'cross/key/bias'),
    PathRule('cross/key/kernel', 'cross/key/kernel'),
    PathRule('cross/out/bias', 'cross/out/bias'),
    PathRule('cross/out/kernel', 'cross/out/kernel'),
    PathRule('cross/query/bias', 'cross/query/bias'),
    PathRule('cross/query/kernel', 'cross/query/kernel'),
    PathRule('cross/value/bias', 'cross/value/bias'),
    PathRule('cross/value/kernel', 'cross/value/kernel'),
])
