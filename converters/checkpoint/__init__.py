"""The checkpoint tool: inspect, restore, convert, verify and compare checkpoints on disk.

`inspect` finds a checkpoint (Orbax, `flax.training.checkpoints` file or
directory), tells what it holds and restores it; `models` declares the model
pair every command reads a checkpoint through (`ModelPair`) and builds the
training states of a user's Linen model and its NNX port abstractly
(`UserModels`), each side a `Side` and both a `CheckpointPlan` (`sides`);
`convert` writes the converted checkpoint atomically
(`convert_checkpoint(src, dst, to, models=..., layout=..., options=...)`)
(`destination` guards SRC and DST); `verify` reads it back and compares it bit
for bit; `compare` compares two training states leaf by leaf;
`training_states` converts whole training states in memory; `weights` reads
and writes checkpoints of weights only. The models come from the caller, any
`ModelPair`: the kit's own MLP is one among users' models
(`linen_nnx_cli.kit_models.KitModels`).

May import: the conversion core. Never a model (`kit_mlp`, `linen_impl`,
`nnx_impl`, `model_zoo`) nor the command line (contract in pyproject.toml): it
reports its stages through a callback, not to the screen.
"""
