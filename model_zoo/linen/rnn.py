"""An LSTM language model in Flax Linen.

Token embedding, one `nn.RNN` over an `nn.LSTMCell` (batch-major sequences),
dense logits. The cell is created inside `RNNLM.__call__`, so Linen makes it
a child of `RNNLM`, not of the `nn.RNN`: its parameters are
`LSTMCell_0/...`, beside `embed` and the output layer `Dense_0` (the `nn.RNN`
named `rnn` holds none).
"""

from __future__ import annotations

import jax
from flax import linen as nn

from model_zoo.configs import RNNConfig


class RNNLM(nn.Module):
  """`__call__(tokens)` maps int tokens `(batch, length)` to logits `(batch, length, vocab)`."""

  config: RNNConfig

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    config = self.config
    x = nn.Embed(config.vocab_size, config.embed_dim, name='embed')(tokens)
    # Linen's OptimizedLSTMCell has the same parameters as LSTMCell; NNX's
    # fuses the gates (the zoo ports to both NNX cells).
    x = nn.RNN(nn.LSTMCell(config.hidden), name='rnn')(x)
    return nn.Dense(config.vocab_size)(x)
