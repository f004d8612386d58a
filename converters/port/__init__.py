"""`linen-nnx port`: the NNX source of a Linen model, written and proven.

`port(linen_model, out)` traces the model, writes one NNX class per Linen
class it uses (Flax's layers become their NNX counterparts) into a module
that imports only Flax, JAX and the user's modules, the path mapping into
a module beside it (`PATHS` of `models_nnx_paths.py`), and proves the port with
`converters.testing.assert_port_equivalent`. What it cannot write it writes
as a stub that raises, and says so.

Names are imported when first used: the test file a port writes needs only
`assert_generated_port` (`assert_generated_decoding`, `decoding_configurations`
for a model that decodes), `assert_checkpoint_trains_on`, `import_file` and `port_paths`,
which run without the `port` extra (libcst, ruff) installed.
"""

import importlib

_WHERE = {
    'PortInputError': 'converters.port.errors',
    'PortOutputError': 'converters.port.errors',
    'PortToolError': 'converters.port.errors',
    'PORT_INSTALL_HINT': 'converters.port.errors',
    'Untranslatable': 'converters.port.errors',
    'PortResult': 'converters.port.generate',
    'Stub': 'converters.port.stubs',
    'port': 'converters.port.generate',
    'write': 'converters.port.generate',
    'assert_checkpoint_trains_on': 'converters.port.training',
    'assert_generated_decoding': 'converters.port.prove',
    'assert_generated_port': 'converters.port.prove',
    'configurations_without_decoding': 'converters.port.prove',
    'decoding_configurations': 'converters.port.prove',
    'import_file': 'converters.port.prove',
    'port_paths': 'converters.port.prove',
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
  if name not in _WHERE:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(_WHERE[name]), name)
