"""The sharded DotReluDot MLP written in Flax NNX.

`model` holds the modules, `train` the sharded creation and the jitted train and
apply functions, `sgd` the hand-written SGD of the NNX FSDP example, and
`checkpoint` the Orbax save and restore. `linen_impl` holds the same files for
Flax Linen, in the same order.

May import: `kit_mlp` (the description both sides build from) and `nnx_port`
(parameters constrained at use, as Linen's are). Not `linen_impl`, `converters`
or the command line: it reads alone.
"""
