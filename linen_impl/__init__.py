"""The sharded DotReluDot MLP written in Flax Linen.

`model` holds the modules, `train` the sharded creation and the jitted train and
apply functions, `checkpoint` the Orbax save and restore. `nnx_impl` holds the
same files for Flax NNX, in the same order.

May import: `kit_mlp` (the description both sides build from). Not `nnx_impl`,
`converters` or the command line: it reads alone.
"""
