"""How the Linen variables of `tests.converters.port.linen_models` map onto the
NNX port `awkward_nnx` (`linen-nnx convert --paths awkward_nnx_paths:PATHS`),
written by `linen-nnx port tests.converters.port.linen_models:awkward`. Kept
apart from the port, which imports only Flax, JAX and your own modules; this
file is the kit's to read.
"""

from converters import PathMapping, PathRule

PATHS = PathMapping([
    PathRule('Dense_{i}/bias', 'denses/{i}/bias'),
    PathRule('Dense_{i}/kernel', 'denses/{i}/kernel'),
    PathRule('class/kernel', 'class_/kernel'),
])
