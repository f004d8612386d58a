"""The kit's own model: the DotReluDot MLP of the Flax guides, described once for both frameworks.

`description` holds `ModelDescription` (layers, depth, layout, annotations,
rules, mesh) that `linen_impl` and `nnx_impl` both build from, `data` the
batches and their sharding, `optimizers` the optimizer presets (adam, adamw,
sgd_momentum, fsdp_sgd); the hypothesis strategies over all of them are the
tests' (`tests/kit_mlp/strategies.py`).

May import: JAX, Flax, optax. Nothing of the kit: the implementations import
it, and it stays below them.
"""
