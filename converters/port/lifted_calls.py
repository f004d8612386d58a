"""The call of modules a compact method ran under `nn.scan` / `nn.remat`,
as its port's `__call__` writes it: a function under NNX's transforms
(`converters.port.transforms.call_function`), written before the statement,
applied to the carry and the stack of modules (`self.blocks`), or under
remat alone to the module itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import source, syntax, transforms

if TYPE_CHECKING:
  from converters.port.compact import CompactWriter


def lifted_call(writer: CompactWriter, original: cst.Call, updated: cst.Call,
                site) -> tuple[cst.FunctionDef, cst.Call]:
  """`(function, call)` for the call `original` (`updated`, its arguments
  rewritten) of the modules made at `site`: the function running them
  under NNX's transforms, and its call replacing `original`."""
  lift, local = writer.lifts[site]
  attribute = writer.attributes[site][0]
  call = writer.mode_flags.without_arguments(original, updated, writer.sites[site][1][0])
  args = list(call.args)
  if lift.scan and (not args or args[0].star or args[0].keyword is not None):
    writer.fail(original, 'a scanned module called without its carry first; port it by hand')
  used = source.names_in(writer.method)
  # A layer of the stack (`block` of `blocks`), or the module remat runs.
  module = attribute[:-1] if lift.scan and attribute.endswith('s') and len(attribute) > 1 else 'layer'
  while module in used:
    module += '_'
  name = local or f'run_{attribute}'
  stack = syntax.expression(f'self.{attribute}')
  if not lift.scan and not (args and not args[0].star and args[0].keyword is None
                            and args[0].value is updated.args[0].value and 1 not in lift.static_argnums):
    # Under remat alone, its inputs closed over: none passed, or the first
    # static (`static_argnums` counts the module: 1 is its first input).
    inner = cst.Call(cst.Name(module), syntax.normalised(args))
    return (transforms.call_function(lift, name, '', module, inner),
            cst.Call(cst.Name(name), [cst.Arg(call.func)]))
  carry_value, rest = args[0].value, args[1:]
  if lift.scan and rest and not lift.broadcast:
    writer.fail(original, 'nn.scan over the arguments after the carry (in_axes other than '
                'nn.broadcast): not written yet; port it by hand')
  carry = carry_value.value if isinstance(carry_value, cst.Name) else 'carry'
  if carry in set().union(*(source.names_in(a.value) for a in rest)) if rest else False:
    carry = 'carry'  # the other arguments read the name outside: keep them reading it
  while carry in used - ({carry_value.value} if isinstance(carry_value, cst.Name) else set()):
    carry += '_'
  inner = cst.Call(cst.Name(module), syntax.normalised([cst.Arg(cst.Name(carry)), *rest]))
  held = stack if lift.scan else call.func  # the module itself (a list's entry in a loop)
  return (transforms.call_function(lift, name, carry, module, inner),
          cst.Call(cst.Name(name), syntax.normalised([cst.Arg(carry_value), cst.Arg(held)])))
