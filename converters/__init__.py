"""linen-nnx-kit core: the shared model description and the conversions.

`converters.description` holds the model description that `linen_impl` and
`nnx_impl` both build from; `converters.optimizers` and `converters.data` the
optimizers and batches they share; `converters.cli` the `linen-nnx` command.
"""
