"""Flax's sst2 example: the Linen text classifier, as published.

`linen_models.py` is `examples/sst2/models.py` of google/flax at 18f8f311,
unchanged (Apache License 2.0, as its header says). Its LSTM scans its
`__call__` over the inputs (`functools.partial(nn.transforms.scan, ...)`),
asks a throwaway cell for its carry, and every class merges a `deterministic`
field with the call's argument: the tests use it as a model nobody on this
team wrote.
"""
