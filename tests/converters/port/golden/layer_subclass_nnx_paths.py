"""How the Linen variables of `tests.converters.port.golden.layer_subclass` map
onto the NNX port `layer_subclass_nnx` (`linen-nnx convert --paths
layer_subclass_nnx_paths:PATHS`), written by `linen-nnx port
tests.converters.port.golden.layer_subclass:model`. Kept apart from the port,
which imports only Flax, JAX and your own modules; this file is the kit's to
read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('unit1/conv1/bias', 'unit1/conv1/bias'),
    PathRule('unit1/conv1/kernel', 'unit1/conv1/kernel'),
    PathRule('unit1/conv2/bias', 'unit1/conv2/bias'),
    PathRule('unit1/conv2/kernel', 'unit1/conv2/kernel'),
    PathRule('unit1/conv_proj/kernel', 'unit1/conv_proj/kernel'),
    PathRule('unit{i+2}/conv1/bias', 'units/{i}/conv1/bias'),
    PathRule('unit{i+2}/conv1/kernel', 'units/{i}/conv1/kernel'),
    PathRule('unit{i+2}/conv2/bias', 'units/{i}/conv2/bias'),
    PathRule('unit{i+2}/conv2/kernel', 'units/{i}/conv2/kernel'),
    PathRule('unit{i+2}/conv_proj/kernel', 'units/{i}/conv_proj/kernel'),
])
