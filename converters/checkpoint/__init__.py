"""The checkpoint tool: inspect, restore, convert, verify and compare checkpoints on disk.

`inspect` finds a checkpoint (Orbax, `flax.training.checkpoints` file or
directory), tells what it holds and restores it; `models` declares the model
pair every command reads a checkpoint through (`ModelPair`) and builds the
training states of a user's Linen model and its NNX port abstractly
(`UserModels`); `convert` writes the converted checkpoint atomically
(`convert_checkpoint(src, dst, to, models=..., layout=..., options=...)`)
(`destination` guards SRC and DST); `verify` reads it back and compares it bit
for bit; `compare` compares two training states leaf by leaf;
`training_states` converts whole training states in memory; `kit` is the
built-in model pair, the kit's own MLP described by its checkpoint (`KitModels`,
the default when no models are given), with its optimizers and trainers, and
`models_for`, which builds either pair from the command line's options.

May import: the conversion core; only `kit` imports the kit's MLP
(`kit_mlp`, `linen_impl`, `nnx_impl`), and `convert` and `compare` reach it
only through `kit` (contracts in pyproject.toml). Never the command line: it
reports its stages through a callback, not to the screen.
"""
