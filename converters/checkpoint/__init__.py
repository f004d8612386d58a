"""The checkpoint tool: inspect, restore, convert, verify and compare checkpoints on disk.

`inspect` finds a checkpoint (Orbax, `flax.training.checkpoints` file or
directory), tells what it holds and restores it; `convert` writes the converted
checkpoint atomically (`destination` guards SRC and DST); `verify` reads it
back and compares it bit for bit; `compare` compares two training states leaf
by leaf; `training_states` converts whole training states in memory; `kit`
registers the kit's own optimizers with the core.

May import: the conversion core, and, until the tool takes users' models, the
kit's MLP (`kit_mlp`, `linen_impl`, `nnx_impl`). Never the command line: it
reports its stages through a callback, not to the screen.
"""
