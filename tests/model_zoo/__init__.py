"""Tests of `model_zoo`: each Linen model and its NNX port compute the same function."""
