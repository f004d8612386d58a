"""`linen-nnx port`: the NNX source of a Linen model, written and proven.

`port(linen_model, out)` traces the model, writes one NNX class per Linen
class it uses (Flax's layers become their NNX counterparts), the path
mapping beside them (`PATHS`), and proves the file with
`converters.testing.assert_port_equivalent`. What it cannot write it writes
as a stub that raises, and says so.
"""

from converters.port.errors import PortOutputError, Untranslatable
from converters.port.generate import PortResult, Stub, port, write
from converters.port.prove import assert_generated_port, import_file

__all__ = ['PortOutputError', 'PortResult', 'Untranslatable', 'Stub', 'assert_generated_port', 'import_file', 'port', 'write']
