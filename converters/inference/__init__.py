"""Inferring the Linen <-> NNX path mapping from what the two models compute.

`infer_paths(linen_module, nnx_model, *example_args)` traces both forward
passes abstractly (`jax.make_jaxpr` on `ShapeDtypeStruct`s), builds the
dataflow graph of each in a form two correct ports share (`dataflow`),
pairs the variables by the structure of the whole computation, never by
name or order (`refinement`), and proves the pairs by running both models
on the example inputs with random variables converted through them
(`witness`) before it returns the rules (`folding`: layers of a loop fold
into `{i}` templates). What the structure cannot tell apart is decided by
the witness, or refused. `infer_models` is what `paths='infer'` of the
conversions runs (`infer_linen_model` of one `LinenModel`); `merge_layouts` joins the mappings of both layouts.

Modules: `traces`, `jaxprs` (what an equation is: a call, a loop, a
branch or a placement, told by its primitive, and one interpreter that
inlines calls, which `dataflow`, `evaluation` and `unrolling` are built on),
`unrolling` (a trace with its scans unrolled), `dataflow`, `refinement`,
`evaluation` and `operations` (a program run operation by operation),
`witness`, `folding`, and `infer` (the two entry points).
"""

from converters.inference.folding import fold, merge_layouts
from converters.inference.infer import abstract_port, infer_linen_model, infer_models, infer_paths

__all__ = ['abstract_port', 'fold', 'infer_linen_model', 'infer_models', 'infer_paths', 'merge_layouts']
