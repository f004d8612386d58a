"""Flax's lm1b example: the Linen model and the maintainers' NNX port, as published.

`linen_models.py` is `examples/lm1b/models.py` of google/flax at 18f8f311;
`nnx_models.py` and `nnx_config.py` are `examples/lm1b_nnx/models.py` and
`configs/default.py` at 881b8ed4^ (the last commit that held the NNX port).
Unchanged but for one line: the port's `from configs import default` reads
`from . import nnx_config as default`. Apache License 2.0, as each file's
header says. The tests use them as models nobody on this team wrote.
"""
