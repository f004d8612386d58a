"""The kit's own model: the DotReluDot MLP of the Flax guides, described once for both frameworks.

`description` holds `ModelDescription` (layers, depth, layout, annotations,
rules, mesh) that `linen_impl` and `nnx_impl` both build from, `data` the
batches and their sharding, `optimizers` the optimizer presets (adam, adamw,
sgd_momentum, fsdp_sgd) and `strategies` the hypothesis strategies over all of
them (for the kit's property tests; needs the `test` extra).

May import: JAX, Flax, optax (and hypothesis in `strategies`). Nothing of the
kit: the implementations import it, and it stays below them.
"""
