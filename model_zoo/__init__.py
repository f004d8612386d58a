"""A zoo of small Flax Linen models and their hand-written Flax NNX ports.

Each model lives twice, in `model_zoo.linen.<name>` and `model_zoo.nnx.<name>`,
with the same file names and the same class and function names in the same
order, so that the two can be read side by side: a CNN (`cnn`), a ResNet with
BatchNorm (`resnet`), a decoder-only transformer LM with logical sharding
annotations and autoregressive decoding (`transformer`), an LSTM language
model (`rnn`), and a small MLP classifier (`mlp`) half-ported through
`nnx.bridge` and sowing its hidden activations. `model_zoo.configs` holds the
configurations (small by default, `realistic()` for real sizes) and
`model_zoo.paths` the parameter path correspondence between each Linen model
and its port, as plain data (the MLP's are not needed: it shows the bridge).

The zoo stands alone: it imports only jax, flax, optax and numpy, never the
kit's own packages (`converters`, `kit_mlp`, `linen_impl`, `nnx_impl`,
`linen_nnx_cli`).
"""
