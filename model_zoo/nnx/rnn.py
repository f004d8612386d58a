"""The LSTM language model ported to Flax NNX.

`nnx.RNN` over an `nnx.LSTMCell` (`cell='lstm'`), or over NNX's
`nnx.OptimizedLSTMCell` (`cell='optimized_lstm'`), which computes the same
function with the four gates fused: one input kernel `dense_i` (in, 4 *
hidden) and one recurrent `dense_h` (hidden, 4 * hidden) with its bias, the
gates side by side in the order i, f, g, o, where Linen's `LSTMCell` has a
kernel per gate (`ii`, `if`, ... and `hi`, `hf`, ... with biases). The
`LSTMCell`'s forget-gate input kernel is `if_` (`if` is a Python keyword),
where Linen's is `if`. `nnx.RNN` keeps an RNG stream of its own for the
initial carry (`rnn/rngs`), which Linen's `nn.RNN` does not store.
"""

from __future__ import annotations

import jax
from flax import nnx

from model_zoo.configs import RNNConfig


#: The cells a port may run: `'lstm'` has Linen's parameters, one kernel per
#: gate; `'optimized_lstm'` fuses the gates' kernels.
CELLS = {'lstm': nnx.LSTMCell, 'optimized_lstm': nnx.OptimizedLSTMCell}


class RNNLM(nnx.Module):
  """`__call__(tokens)` maps int tokens `(batch, length)` to logits `(batch, length, vocab)`."""

  def __init__(self, config: RNNConfig, *, cell: str = 'lstm', rngs: nnx.Rngs):
    if cell not in CELLS:
      raise ValueError(f'cell must be one of {tuple(CELLS)}, got {cell!r}')
    self.config = config
    self.embed = nnx.Embed(config.vocab_size, config.embed_dim, rngs=rngs)
    self.rnn = nnx.RNN(CELLS[cell](config.embed_dim, config.hidden, rngs=rngs))
    self.logits = nnx.Linear(config.hidden, config.vocab_size, rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    x = self.embed(tokens)
    x = self.rnn(x)
    return self.logits(x)
