"""How the Linen variables of `tests.converters.port.golden.self_attention` map
onto the NNX port `self_attention_nnx` (`linen-nnx convert --paths
self_attention_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.self_attention:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('ViTBlock_{i}/Dense_0/bias', 'vit_blocks/{i}/dense_0/bias'),
    PathRule('ViTBlock_{i}/Dense_0/kernel', 'vit_blocks/{i}/dense_0/kernel'),
    PathRule('ViTBlock_{i}/Dense_1/bias', 'vit_blocks/{i}/dense_1/bias'),
    PathRule('ViTBlock_{i}/Dense_1/kernel', 'vit_blocks/{i}/dense_1/kernel'),
    PathRule('ViTBlock_{i}/LayerNorm_0/bias', 'vit_blocks/{i}/layer_norm_0/bias'),
    PathRule('ViTBlock_{i}/LayerNorm_0/scale', 'vit_blocks/{i}/layer_norm_0/scale'),
    PathRule('ViTBlock_{i}/LayerNorm_1/bias', 'vit_blocks/{i}/layer_norm_1/bias'),
    PathRule('ViTBlock_{i}/LayerNorm_1/scale', 'vit_blocks/{i}/layer_norm_1/scale'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/key/bias', 'vit_blocks/{i}/multi_head_dot_product_attention/key/bias'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/key/kernel', 'vit_blocks/{i}/multi_head_dot_product_attention/key/kernel'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/out/bias', 'vit_blocks/{i}/multi_head_dot_product_attention/out/bias'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/out/kernel', 'vit_blocks/{i}/multi_head_dot_product_attention/out/kernel'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/query/bias', 'vit_blocks/{i}/multi_head_dot_product_attention/query/bias'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/query/kernel', 'vit_blocks/{i}/multi_head_dot_product_attention/query/kernel'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/value/bias', 'vit_blocks/{i}/multi_head_dot_product_attention/value/bias'),
    PathRule('ViTBlock_{i}/MultiHeadDotProductAttention_0/value/kernel', 'vit_blocks/{i}/multi_head_dot_product_attention/value/kernel'),
])
