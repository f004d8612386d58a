"""How the Linen variables of `tests.converters.port.golden.remat` map onto the
NNX port `remat_nnx` (`linen-nnx convert --paths remat_nnx_paths:PATHS`),
written by `linen-nnx port tests.converters.port.golden.remat:model`. Kept
apart from the port, which imports only Flax, JAX and your own modules; this
file is the kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('CheckpointDense_0/bias', 'dense/bias'),
    PathRule('CheckpointDense_0/kernel', 'dense/kernel'),
    PathRule('block_{i}/Dense_0/bias', 'blocks/{i}/dense/bias'),
    PathRule('block_{i}/Dense_0/kernel', 'blocks/{i}/dense/kernel'),
    PathRule('last/Dense_0/bias', 'last/dense/bias'),
    PathRule('last/Dense_0/kernel', 'last/dense/kernel'),
    PathRule('norm/bias', 'norm/bias'),
    PathRule('norm/scale', 'norm/scale'),
    PathRule('odd_{i}/Dense_0/bias', 'odds/{i}/dense/bias'),
    PathRule('odd_{i}/Dense_0/kernel', 'odds/{i}/dense/kernel'),
    PathRule('scaled/Dense_0/bias', 'scaled/dense/bias'),
    PathRule('scaled/Dense_0/kernel', 'scaled/dense/kernel'),
    PathRule('shared/Dense_0/bias', 'shared/dense/bias'),
    PathRule('shared/Dense_0/kernel', 'shared/dense/kernel'),
])
