"""The sharded DotReluDot MLP written in Flax NNX.

`model` holds the modules, `train` the sharded creation and the jitted train and
apply functions, `sgd` the hand-written SGD of the NNX FSDP example, and
`checkpoint` the Orbax save and restore. `linen_impl` holds the same files for
Flax Linen, in the same order.
"""
