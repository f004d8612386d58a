"""The sharded DotReluDot MLP written in Flax Linen.

`model` holds the modules, `train` the sharded creation and the jitted train and
apply functions, `checkpoint` the Orbax save and restore. `nnx_impl` holds the
same files for Flax NNX, in the same order.
"""
