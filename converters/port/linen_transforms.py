"""Linen's lifted transforms, a rule each (as jax2tf keeps one rule per
primitive): NNX's counterpart, what the port writes of it, and, where it
does not, the NNX code to write in its place, which a refusal states.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TransformRule:
  """How Linen's `nn.<linen>` is written in NNX.

  Attributes:
    linen: its name in `flax.linen`.
    nnx: NNX's counterpart (`nnx.vmap`), or None where NNX needs none.
    written: what the port writes of it (`converters.port.lifted_classes`), or
      None for nothing.
    by_hand: the NNX code to write where the port does not.
  """

  linen: str
  nnx: str | None
  written: str | None
  by_hand: str


RULES = (
    TransformRule(
        'scan', 'nnx.scan',
        'a module scanned with length=, every collection on axis 0, params split, the arguments after the '
        'carry broadcast; a compact __call__ scanned over its inputs, parameters broadcast',
        'make a stack of layers under @nnx.split_rngs(splits=n) and @nnx.vmap(in_axes=(0,), out_axes=0) over '
        'a function returning one, and run it with @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry) over '
        'a function of (carry, layer); a method scanned over its inputs, decorate it with @nnx.scan, its '
        'in_axes and out_axes as Linen\'s, the module broadcast (None)'),
    TransformRule(
        'remat', 'nnx.remat', 'a module or a compact __call__, with prevent_cse, policy or static_argnums',
        'call the module inside a function decorated @nnx.remat (its static arguments closed over)'),
    TransformRule(
        'checkpoint', 'nnx.remat', 'as nn.remat, of which it is another name',
        'call the module inside a function decorated @nnx.remat (its static arguments closed over)'),
    TransformRule(
        'remat_scan', 'nnx.scan', None,
        'nest @nnx.scan over @nnx.remat, a stack made under nnx.vmap for each of its lengths'),
    TransformRule(
        'vmap', 'nnx.vmap', None,
        'call the module inside a function decorated @nnx.vmap, its state mapped by '
        'nnx.StateAxes (nnx.Param: None where variable_axes broadcast the parameters; 0 where they '
        'stack them, the stack made under @nnx.split_rngs and @nnx.vmap)'),
    TransformRule(
        'jit', 'nnx.jit', None,
        'decorate the method with @nnx.jit, or drop it and jit the step that calls the model'),
    TransformRule(
        'map_variables', None, None,
        'NNX has no counterpart: change the variables where the module reads them (self.kernel[...])'),
    TransformRule(
        'while_loop', 'nnx.while_loop', None,
        'nnx.while_loop(cond_fun, body_fun, (module, carry)): the module is part of the loop\'s state'),
    TransformRule(
        'cond', 'nnx.cond', None, 'nnx.cond(pred, true_fun, false_fun, module, *operands)'),
    TransformRule(
        'switch', 'nnx.switch', None, 'nnx.switch(index, branches, module, *operands)'),
    TransformRule(
        'custom_vjp', 'nnx.custom_vjp', None,
        'decorate a function taking the module with @nnx.custom_vjp and give it its rules with '
        '.defvjp(fwd, bwd)'),
    TransformRule('vjp', 'nnx.vjp', None, 'nnx.vjp(fn, module, *primals) over a function taking the module'),
    TransformRule('jvp', 'nnx.jvp', None, 'nnx.jvp(fn, (module, *primals), (tangents...)) over a function taking the module'),
    TransformRule('grad', 'nnx.grad', None, 'nnx.grad(fn)(module, *args) over a function taking the module'),
    TransformRule(
        'value_and_grad', 'nnx.value_and_grad', None,
        'nnx.value_and_grad(fn)(module, *args) over a function taking the module'),
    TransformRule(
        'fold_rngs', None, None,
        'NNX needs no transform: its streams count their draws, so each call draws new keys'),
    TransformRule(
        'add_metadata_axis', None, None,
        'give the axis name to the nnx.vmap or nnx.scan that stacks the layers, as '
        'transform_metadata={nnx.PARTITION_NAME: name}'),
    TransformRule(
        'named_call', None, None,
        'NNX needs no transform to name a call: wrap it in `with jax.named_scope(name):`'),
)

BY_NAME = {rule.linen: rule for rule in RULES}
#: Their names in `flax.linen`.
NAMES = tuple(BY_NAME)


def by_hand(name: str) -> str:
  """What to write for `nn.<name>` where the port does not: its rule's NNX
  code, or (for a name not in the table) to port it by hand."""
  rule = BY_NAME.get(name)
  return f'in NNX, {rule.by_hand}' if rule is not None else 'port it by hand'
