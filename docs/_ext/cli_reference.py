"""The `linen-nnx` reference, generated from its argparse parser.

    ```{linen-nnx-command} convert
    ```

writes the command's description, usage and every option with its help,
choices and default, as `linen_nnx_cli.main.build_parser()` defines them.
The build fails when a command of the parser has no such directive.
"""

from __future__ import annotations

import argparse
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import SphinxError
from sphinx.util.docutils import SphinxDirective


def _subcommands() -> argparse._SubParsersAction:
  from linen_nnx_cli.main import build_parser

  (subparsers,) = [
      action for action in build_parser()._actions
      if isinstance(action, argparse._SubParsersAction)
  ]
  return subparsers


def commands() -> dict[str, argparse.ArgumentParser]:
  """`{name: parser}` of every `linen-nnx` command."""
  return dict(_subcommands().choices)


def _option(action: argparse.Action) -> str:
  if not action.option_strings:
    return action.metavar or action.dest
  text = ', '.join(action.option_strings)
  if action.nargs != 0:
    if action.choices:
      text += ' ' + '|'.join(map(str, action.choices))
    else:
      text += ' ' + (action.metavar or action.dest.upper())
  return text


def _help(action: argparse.Action) -> str:
  text = (action.help or '').replace('%%', '%')
  if action.required and action.option_strings:
    text += ' Required.'
  if (action.option_strings and action.nargs != 0 and action.default not in (None, argparse.SUPPRESS)):
    default = action.default
    if isinstance(default, tuple) and all(isinstance(n, int) for n in default):
      default = 'x'.join(map(str, default))  # a mesh shape, as it is typed
    text += f' Default: {default}.'
  return text.strip()


class CommandReference(SphinxDirective):
  """One `linen-nnx` command: description, usage, arguments and options."""

  required_arguments = 1

  def run(self) -> list[nodes.Node]:
    name = self.arguments[0]
    subparsers = _subcommands()
    parsers = dict(subparsers.choices)
    if name not in parsers:
      raise self.error(f'linen-nnx has no command {name!r}; it has {", ".join(parsers)}')
    documented = self.env.__dict__.setdefault('cli_reference_documented', {})
    documented.setdefault(self.env.docname, set()).add(name)
    parser = parsers[name]
    parser.prog = f'linen-nnx {name}'
    out: list[nodes.Node] = []
    # A command with no description has the one-line help of the command list.
    description = parser.description or next(
        (c.help for c in subparsers._choices_actions if c.dest == name), '')
    if description:
      out.append(nodes.paragraph(text=description))
    usage = parser.format_usage().removeprefix('usage: ').strip()
    out.append(nodes.literal_block(usage, usage, language='text'))
    for group in parser._action_groups:
      actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
      if not actions:
        continue
      out.append(nodes.rubric(text=group.title))
      if group.description:
        out.append(nodes.paragraph(text=group.description))
      items = nodes.definition_list()
      for action in actions:
        term = nodes.term()
        term += nodes.literal(text=_option(action))
        definition = nodes.definition()
        definition += nodes.paragraph(text=_help(action) or '(no help text)')
        items += nodes.definition_list_item('', term, definition)
      out.append(items)
    return out


def _check(app: Sphinx, exception) -> None:
  if exception is not None:
    return
  documented = set().union(*getattr(app.env, 'cli_reference_documented', {}).values())
  missing = sorted(set(commands()) - documented)
  if missing:
    raise SphinxError(
        'linen-nnx commands the reference leaves out (add a `linen-nnx-command` '
        'directive to docs/reference/command_line.md): ' + ', '.join(missing))


def _purge(app: Sphinx, env, docname: str) -> None:
  getattr(env, 'cli_reference_documented', {}).pop(docname, None)


def setup(app: Sphinx) -> dict[str, Any]:
  app.add_directive('linen-nnx-command', CommandReference)
  app.connect('env-purge-doc', _purge)
  app.connect('build-finished', _check)
  return {'version': '1', 'parallel_read_safe': False}
