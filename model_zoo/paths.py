"""Where each variable of a Linen zoo model lives in its NNX port, written by hand as plain data.

Each model has a table `{linen_collection: rows}`; the collections are
`'params'`, `'batch_stats'` (NNX `nnx.BatchStat`) and `'cache'` (NNX
`nnx.Cache`; Linen's decode-mode `init` creates it, NNX's `init_cache`).
A row is `Row(linen, nnx, linen_stacked, nnx_stacked)`:

- `linen`: the '/'-joined keys below the collection root, e.g.
  `'Block_{i}/attention/query/kernel'` for `variables['params']['Block_0']...`;
- `nnx`: the '/'-joined attribute path from the model, list indices as
  digits, e.g. `'blocks/{i}/attention/query/kernel'`;
- `{i}` marks the index of a repeated layer (a block, a convolution) in
  looped form and is replaced by 0, 1, ...;
- `linen_stacked`, `nnx_stacked`: for a `{i}` row of a model that can stack
  its layers (`TransformerConfig.scan_layers`), the one path of the stacked
  array whose leading axis is the layer index; otherwise None. A row without
  `{i}` is the same in both layouts.

A row with a `pattern` maps a Linen variable to an NNX variable of another
shape: the same elements in the same (row-major) order, reshaped. A
`FusedRow(linen, nnx, pattern, sizes, linen_stacked, nnx_stacked)` maps
several Linen variables (`linen`, a tuple of paths) to one NNX variable that
holds them side by side: each reshaped to the NNX array's leading axes, then
concatenated on the last axis in the order given. `pattern` and `sizes` say
the same in the notation of `converters.Rearrange`, for the tests that convert.

A row may name a variable that some configurations lack (the projection
shortcut of a ResNet block that keeps its shape, the bias of an RMSNorm): it
applies wherever the path exists on both sides, and a path found on one side
only is an error.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
  linen: str
  nnx: str
  linen_stacked: str | None = None
  nnx_stacked: str | None = None
  pattern: str | None = None
  sizes: tuple[tuple[str, int], ...] = ()


class FusedRow(NamedTuple):
  linen: tuple[str, ...]
  nnx: str
  pattern: str
  sizes: tuple[tuple[str, int], ...] = ()
  linen_stacked: tuple[str, ...] | None = None
  nnx_stacked: str | None = None


CNN = {
    'params': (
        Row('Conv_{i}/kernel', 'convs/{i}/kernel'),
        Row('Conv_{i}/bias', 'convs/{i}/bias'),
        Row('Dense_0/kernel', 'hidden/kernel'),
        Row('Dense_0/bias', 'hidden/bias'),
        Row('Dense_1/kernel', 'logits/kernel'),
        Row('Dense_1/bias', 'logits/bias'),
    ),
}

RESNET = {
    'params': (
        Row('conv_init/kernel', 'conv_init/kernel'),
        Row('bn_init/scale', 'bn_init/scale'),
        Row('bn_init/bias', 'bn_init/bias'),
        Row('ResNetBlock_{i}/Conv_0/kernel', 'blocks/{i}/conv1/kernel'),
        Row('ResNetBlock_{i}/BatchNorm_0/scale', 'blocks/{i}/norm1/scale'),
        Row('ResNetBlock_{i}/BatchNorm_0/bias', 'blocks/{i}/norm1/bias'),
        Row('ResNetBlock_{i}/Conv_1/kernel', 'blocks/{i}/conv2/kernel'),
        Row('ResNetBlock_{i}/BatchNorm_1/scale', 'blocks/{i}/norm2/scale'),
        Row('ResNetBlock_{i}/BatchNorm_1/bias', 'blocks/{i}/norm2/bias'),
        Row('ResNetBlock_{i}/conv_proj/kernel', 'blocks/{i}/conv_proj/kernel'),
        Row('ResNetBlock_{i}/norm_proj/scale', 'blocks/{i}/norm_proj/scale'),
        Row('ResNetBlock_{i}/norm_proj/bias', 'blocks/{i}/norm_proj/bias'),
        Row('head/kernel', 'head/kernel'),
        Row('head/bias', 'head/bias'),
    ),
    'batch_stats': (
        Row('bn_init/mean', 'bn_init/mean'),
        Row('bn_init/var', 'bn_init/var'),
        Row('ResNetBlock_{i}/BatchNorm_0/mean', 'blocks/{i}/norm1/mean'),
        Row('ResNetBlock_{i}/BatchNorm_0/var', 'blocks/{i}/norm1/var'),
        Row('ResNetBlock_{i}/BatchNorm_1/mean', 'blocks/{i}/norm2/mean'),
        Row('ResNetBlock_{i}/BatchNorm_1/var', 'blocks/{i}/norm2/var'),
        Row('ResNetBlock_{i}/norm_proj/mean', 'blocks/{i}/norm_proj/mean'),
        Row('ResNetBlock_{i}/norm_proj/var', 'blocks/{i}/norm_proj/var'),
    ),
}

# The scanned Linen blocks are `nn.scan(nn.remat(Block))`: `nn.remat` names
# the class `CheckpointBlock`, `nn.scan` prefixes `Scan`.
_LINEN_BLOCK, _LINEN_STACKED = 'Block_{i}', 'ScanCheckpointBlock_0'


def _block_row(linen: str, nnx: str, pattern: str | None = None, sizes=()) -> Row:
  return Row(f'{_LINEN_BLOCK}/{linen}', f'blocks/{{i}}/{nnx}',
             f'{_LINEN_STACKED}/{linen}', f'blocks/{nnx}', pattern, sizes)


TRANSFORMER = {
    'params': (
        Row('embed/embedding', 'embed/embedding'),
        Row('pos_embed/embedding', 'pos_embed/embedding'),
        _block_row('attention_norm/scale', 'attention_norm/scale'),
        _block_row('attention_norm/bias', 'attention_norm/bias'),
        _block_row('attention/query/kernel', 'attention/query/kernel'),
        _block_row('attention/key/kernel', 'attention/key/kernel'),
        _block_row('attention/value/kernel', 'attention/value/kernel'),
        _block_row('attention/out/kernel', 'attention/out/kernel'),
        _block_row('mlp_norm/scale', 'mlp_norm/scale'),
        _block_row('mlp_norm/bias', 'mlp_norm/bias'),
        _block_row('mlp/Dense_0/kernel', 'mlp/up/kernel'),
        _block_row('mlp/Dense_0/bias', 'mlp/up/bias'),
        _block_row('mlp/Dense_1/kernel', 'mlp/down/kernel'),
        _block_row('mlp/Dense_1/bias', 'mlp/down/bias'),
        Row('final_norm/scale', 'final_norm/scale'),
        Row('final_norm/bias', 'final_norm/bias'),
    ),
    'cache': (
        Row('pos_embed/cache_index', 'pos_embed/cache_index'),
        _block_row('attention/cached_key', 'attention/cached_key'),
        _block_row('attention/cached_value', 'attention/cached_value'),
        _block_row('attention/cache_index', 'attention/cache_index'),
    ),
}



def transformer_fused_attention(num_heads: int) -> dict:
  """`TRANSFORMER` for the port with `attention='fused_qkv'`: query, key and
  value kernels (E, H, D) side by side in `qkv` (E, 3 * E), the out kernel
  (H, D, E) flattened to (E, E)."""
  attention = [f'attention/{name}/kernel' for name in ('query', 'key', 'value')]
  fused = FusedRow(
      tuple(f'{_LINEN_BLOCK}/{a}' for a in attention), 'blocks/{i}/attention/qkv/kernel',
      'e h d -> e (qkv h d)', (('h', num_heads),),
      tuple(f'{_LINEN_STACKED}/{a}' for a in attention), 'blocks/attention/qkv/kernel',
  )
  out = _block_row('attention/out/kernel', 'attention/out/kernel', 'h d e -> (h d) e', (('h', num_heads),))
  params = [row for row in TRANSFORMER['params'] if '/attention/' not in row.linen]
  return {'params': (*params, fused, out), 'cache': TRANSFORMER['cache']}


# The cell is created in `RNNLM`'s compact `__call__`, so Linen binds it to
# `RNNLM` (auto-named `LSTMCell_0`), not to the `nn.RNN` named `rnn`.
RNN = {
    'params': (
        Row('embed/embedding', 'embed/embedding'),
        Row('LSTMCell_0/ii/kernel', 'rnn/cell/ii/kernel'),
        # NNX spells the forget gate's input kernel `if_`: `if` is a keyword.
        Row('LSTMCell_0/if/kernel', 'rnn/cell/if_/kernel'),
        Row('LSTMCell_0/ig/kernel', 'rnn/cell/ig/kernel'),
        Row('LSTMCell_0/io/kernel', 'rnn/cell/io/kernel'),
        Row('LSTMCell_0/hi/kernel', 'rnn/cell/hi/kernel'),
        Row('LSTMCell_0/hi/bias', 'rnn/cell/hi/bias'),
        Row('LSTMCell_0/hf/kernel', 'rnn/cell/hf/kernel'),
        Row('LSTMCell_0/hf/bias', 'rnn/cell/hf/bias'),
        Row('LSTMCell_0/hg/kernel', 'rnn/cell/hg/kernel'),
        Row('LSTMCell_0/hg/bias', 'rnn/cell/hg/bias'),
        Row('LSTMCell_0/ho/kernel', 'rnn/cell/ho/kernel'),
        Row('LSTMCell_0/ho/bias', 'rnn/cell/ho/bias'),
        Row('Dense_0/kernel', 'logits/kernel'),
        Row('Dense_0/bias', 'logits/bias'),
    ),
}

# NNX's `OptimizedLSTMCell` holds the four gates side by side, in the order
# i, f, g, o: `dense_i` the input kernels, `dense_h` the recurrent kernels and
# the biases (Linen's input kernels have no bias).
_GATES = ('i', 'f', 'g', 'o')
RNN_OPTIMIZED_CELL = {
    'params': (
        Row('embed/embedding', 'embed/embedding'),
        FusedRow(tuple(f'LSTMCell_0/i{g}/kernel' for g in _GATES), 'rnn/cell/dense_i/kernel',
                 'i h -> i (gate h)'),
        FusedRow(tuple(f'LSTMCell_0/h{g}/kernel' for g in _GATES), 'rnn/cell/dense_h/kernel',
                 'i h -> i (gate h)'),
        FusedRow(tuple(f'LSTMCell_0/h{g}/bias' for g in _GATES), 'rnn/cell/dense_h/bias',
                 'h -> (gate h)'),
        Row('Dense_0/kernel', 'logits/kernel'),
        Row('Dense_0/bias', 'logits/bias'),
    ),
}
