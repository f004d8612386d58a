"""How the Linen variables of `tests.converters.port.golden.remat_in_loops` map
onto the NNX port `remat_in_loops_nnx` (`linen-nnx convert --paths
remat_in_loops_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.remat_in_loops:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('mix_{i}/Dense_0/bias', 'mixs/{i}/dense/bias'),
    PathRule('mix_{i}/Dense_0/kernel', 'mixs/{i}/dense/kernel'),
    PathRule('plain_{i}/Dense_0/bias', 'plains/{i}/dense/bias'),
    PathRule('plain_{i}/Dense_0/kernel', 'plains/{i}/dense/kernel'),
    PathRule('scaled_{i}/Dense_0/bias', 'scaleds/{i}/dense/bias'),
    PathRule('scaled_{i}/Dense_0/kernel', 'scaleds/{i}/dense/kernel'),
])
