"""The call of modules a compact method ran under `nn.scan` / `nn.remat`,
as its port's `__call__` writes it: a function under NNX's transforms
(`converters.port.lifted_classes.call_function`), written before the statement,
applied to the carry and the stack of modules (`self.blocks`), or under
remat alone to the module itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from converters.port import lifted_classes, syntax, tracing

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
  used = syntax.names_in(writer.method)
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
    return (lifted_classes.call_function(lift, name, '', module, inner),
            cst.Call(cst.Name(name), [cst.Arg(call.func)]))
  carry_value, rest = args[0].value, args[1:]
  if lift.scan and rest and not lift.broadcast:
    writer.fail(original, 'nn.scan over the arguments after the carry (in_axes other than '
                'nn.broadcast): not written yet; port it by hand')
  carry = carry_value.value if isinstance(carry_value, cst.Name) else (
      'carry' if lift.scan else _input_name(writer, site))
  # The other arguments are read inside the function: a parameter of theirs
  # would shadow what they read outside.
  read_by_rest = set().union(*(syntax.names_in(a.value) for a in rest)) if rest else set()
  if carry in read_by_rest:
    carry = 'carry'
  while carry in read_by_rest | {module}:
    carry += '_'
  rest, passed = _passed_from_loops(writer, original, updated, site, rest, {carry, module}) \
      if not lift.scan else (rest, [])
  inner = cst.Call(cst.Name(module), syntax.normalised([cst.Arg(cst.Name(carry)), *rest]))
  held = stack if lift.scan else call.func  # the module itself (a list's entry in a loop)
  return (lifted_classes.call_function(lift, name, carry, module, inner, passed),
          cst.Call(cst.Name(name), syntax.normalised(
              [cst.Arg(carry_value), cst.Arg(held), *(cst.Arg(value) for _, value, _ in passed)])))


def _passed_from_loops(writer: CompactWriter, original: cst.Call, updated: cst.Call, site,
                       rest: list[cst.Arg], taken: set[str]) -> tuple[list[cst.Arg], list[tuple]]:
  """The arguments after the first input that read a variable of a loop
  around the call (`i % 2 == 1`) passed to the function rather than closed
  over (a function made in a loop reads the variable's last value: ruff's
  B023), static where Linen's were: `(rest, [(parameter, value, static)])`,
  `rest` reading the parameters."""
  loops = [n for n in writer.file.ancestors(original) if isinstance(n, cst.For)]
  bound = set().union(*(syntax.names_in(n.target) | syntax.bound_in(n.body) for n in loops)) if loops else set()
  if not bound:
    return rest, []
  lift = writer.lifts[site][0]
  signature = [p.name for p in tracing.parameters_after_self(type(writer.sites[site][1][0].module).__call__)]
  positions = {id(a.value): k for k, a in enumerate(updated.args)}  # (the mode flags' taken out)
  # The arguments left closed over read their names inside the function:
  # no parameter takes one of them.
  taken = taken | set().union(*(syntax.names_in(a.value) for a in rest if not syntax.names_in(a.value) & bound))
  written, passed = [], []
  for arg in rest:
    if not syntax.names_in(arg.value) & bound:
      written.append(arg)
      continue
    position = positions.get(id(arg.value))
    name = arg.keyword.value if arg.keyword is not None else (
        signature[position] if position is not None and position < len(signature) else 'value')
    while name in taken:
      name += '_'
    taken.add(name)
    # Linen counts the module as argument 0: the call's k-th argument is k + 1.
    static = arg.keyword is None and position is not None and position + 1 in lift.static_argnums
    passed.append((name, arg.value, static))
    written.append(arg.with_changes(value=cst.Name(name)))
  return written, passed


def _input_name(writer: CompactWriter, site) -> str:
  """The name the module made at `site` gives its first input (`x` of a
  user's `Block.__call__(self, x)`, `inputs` of `nn.Dense`): what the
  function running it under remat calls the input it passes."""
  made = writer.sites[site][1][0]
  parameters = tracing.parameters_after_self(type(made.module).__call__)[:1]
  if parameters and parameters[0].kind in (parameters[0].POSITIONAL_ONLY, parameters[0].POSITIONAL_OR_KEYWORD):
    return parameters[0].name
  return 'x'
