"""Flax's imagenet example: the Linen ResNet, as published.

`linen_models.py` is `examples/imagenet/models.py` of google/flax at 18f8f311,
unchanged (Apache License 2.0, as its header says). Its blocks take their
convolution and norm as fields (module classes and `functools.partial`s of
them): the tests use it as a model nobody on this team wrote.
"""
