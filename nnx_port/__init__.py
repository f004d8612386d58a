"""What an NNX port of a Linen model uses to compile to its original's program.

`constrained_params` holds `ConstrainedParam`, an `nnx.Param` constrained to its
annotation at every traced read as Linen's boxes are, and
`constrain_params_at_use(model)`. `converters` re-exports both; `nnx_impl`
uses them.

May import: JAX and Flax only. It knows no model and nothing of the kit.
"""
