"""The LSTM language model ported to Flax NNX.

`nnx.RNN` over an `nnx.LSTMCell`. The cell's forget-gate input kernel is
`if_` (`if` is a Python keyword), where Linen's is `if`. `nnx.RNN` keeps an
RNG stream of its own for the initial carry (`rnn/rngs`), which Linen's
`nn.RNN` does not store.
"""

from __future__ import annotations

import jax
from flax import nnx

from model_zoo.configs import RNNConfig


# [side-by-side: rnn]
class RNNLM(nnx.Module):
  """`__call__(tokens)` maps int tokens `(batch, length)` to logits `(batch, length, vocab)`."""

  def __init__(self, config: RNNConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = nnx.Embed(config.vocab_size, config.embed_dim, rngs=rngs)
    self.rnn = nnx.RNN(nnx.LSTMCell(config.embed_dim, config.hidden, rngs=rngs))
    self.logits = nnx.Linear(config.hidden, config.vocab_size, rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    x = self.embed(tokens)
    x = self.rnn(x)
    return self.logits(x)
# [/side-by-side]
