"""The generated file: the NNX classes, what they need of the Linen module
(imports, constants, helper functions), the path mapping, and ruff's check.

Statements are taken from the Linen file as libcst parsed them, so comments
and layout stay; a helper is copied only if a generated class reads it (or a
copied helper does), an import only if something copied reads its names.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import textwrap

import libcst as cst
from flax import linen as nn

from converters.errors import PathMappingError
from converters.paths import PathMapping, PathRule, format_path
from converters.transforms import Rearrange
from converters.port import classes, layers, placement, references, shapes, source, syntax, tracing, variables
from converters.port.errors import PORT_INSTALL_HINT, PortToolError
from converters.port.stubs import StubPort

#: How many of the variables left out under stubs the mapping's file lists.
_UNMAPPED_SHOWN = 20


def _docstring(*paragraphs: str) -> str:
  """A module docstring of `paragraphs`, each filled to 79 columns."""
  filled = [
      textwrap.fill(p, 79, break_long_words=False, break_on_hyphens=False) for p in paragraphs if p
  ]
  return '"""' + '\n\n'.join(filled) + '\n"""\n'


def _header(origin: str, factory: str, module: str, test: str, mode: str) -> str:
  return _docstring(
      f'NNX port of `{origin}`, written by `linen-nnx port {factory}`.',
      f'Each class is the NNX counterpart of the Linen class of the same name; '
      f'`{module}_paths.PATHS`, written beside this file, maps the Linen variables onto these '
      f'modules (`linen-nnx convert --paths {module}_paths:PATHS`).'
      + (f' Proven equivalent when written: see `{test}`.' if test else ''),
      mode,
  )


def _paths_header(origin: str, factory: str, module: str) -> str:
  return _docstring(
      f'How the Linen variables of `{origin}` map onto the NNX port `{module}` (`linen-nnx '
      f'convert --paths {module}_paths:PATHS`), written by `linen-nnx port {factory}`. Kept apart '
      'from the port, which imports only Flax, JAX and your own modules; this file is the kit\'s '
      'to read.',
  ) + '\n'


def _is_import(statement) -> bool:
  return isinstance(statement, cst.SimpleStatementLine) and isinstance(
      statement.body[0], (cst.Import, cst.ImportFrom)
  )


def _imported_as_is(file: source.SourceFile, statement, name: str) -> bool:
  """Whether the port imports `name`, a class of the user's file other than
  a module (an enum, a configuration dataclass), rather than copying it: a
  copy is another class, whose members and instances the user's (`attn_type
  == AttentionType.GLOBAL`, `isinstance(config, Config)`) are not."""
  value = getattr(file.python_module, name, None)
  module = file.python_module.__name__
  return (isinstance(statement, cst.ClassDef) and isinstance(value, type) and not issubclass(value, nn.Module)
          and module != '__main__' and _importable(module, file.path))


def _importable(module: str, path: str) -> bool:
  """Whether importing `module` by its name finds the file at `path` (not a
  model loaded under a name of its own, nor another file of that name
  earlier on the path)."""
  try:
    spec = importlib.util.find_spec(module)
  except (ImportError, ValueError):
    return False
  return spec is not None and spec.origin is not None and os.path.realpath(spec.origin) == os.path.realpath(path)


def _only_aliases(statement: cst.SimpleStatementLine, names: set[str]) -> cst.SimpleStatementLine | None:
  """An import statement keeping only the aliases binding `names`."""
  small = statement.body[0]
  if isinstance(small, cst.ImportFrom) and small.module is not None and small.module.value == '__future__':
    return statement
  kept = [a for a in small.names if syntax.alias_name(a) in names]
  if not kept:
    return None
  kept = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in kept]
  if isinstance(small, cst.ImportFrom):
    small = small.with_changes(names=kept, lpar=None, rpar=None)
  else:
    small = small.with_changes(names=kept)
  return statement.with_changes(body=[small])


@dataclasses.dataclass
class GeneratedFile:
  """The port module's text, its classes, and the text of its mapping's module."""

  text: str
  classes: list[str]
  paths_text: str


def write_file(
    ports: list[classes.ClassPort | tuple[type, str]],
    mapping: PathMapping,
    *,
    factory: str,
    module_name: str,
    test_name: str,
    modes: dict[str, bool] | None = None,
    unmapped: list[tuple] = (),
) -> GeneratedFile:
  """The generated file's text: `ports` (written classes, or `(cls, source)`
  for classes written as text: stubs, a layer's subclass), in their files' order;
  `unmapped` are the variables under stubs, which `PATHS` leaves out."""
  nodes = _class_statements(ports)
  ported = list(dict.fromkeys(getattr(p, 'cls', None) or p[0] for p in ports))
  files = list(dict.fromkeys(f for f, _ in nodes))
  copies = _Copies(ports, nodes, {c.__name__ for c in ported})
  for file in files:
    copies.copy_from(file)
  copied_imports, helpers = _copied_code(files, copies.chosen)
  origin = ', '.join(sorted({f.python_module.__name__ for f in files}))
  parts = [
      _header(origin, factory, module_name, test_name, _mode_paragraph(modes)),
      _FUTURE,
      _imports(copied_imports, copies.imported, nodes),
      *helpers,
  ]
  for collection, name in _sown(ports).items():
    parts.append('\n\n' + variables.sown_type(collection, name, files[0].module.default_indent))
  for file, node in nodes:  # in the file's own indentation, with the comments above it
    parts.append('\n\n' + file.module.code_for_node(node.with_changes(leading_lines=_comments(node))))
  paths_text = _paths_header(origin, factory, module_name) + _paths_body(mapping, unmapped)
  return GeneratedFile(''.join(parts), [c.__name__ for c in ported], paths_text)


_FUTURE = 'from __future__ import annotations\n'


def _class_statements(ports) -> list[tuple[source.SourceFile, cst.CSTNode]]:
  """The statements written for `ports`, each with its class's file: a
  written class after the module constants its fields' defaults need, a
  class written as text statement by statement."""
  nodes: list[tuple[source.SourceFile, cst.CSTNode]] = []
  constants: dict[str, str] = {}  # module constants written (fields' defaults): name -> value's code
  for port in ports:
    if isinstance(port, classes.ClassPort):
      nodes += _with_constants(port, constants)
    else:
      cls, text = port
      module = cst.parse_module(text)
      body = list(module.body)  # the comments above the first statement with it
      body[0] = body[0].with_changes(leading_lines=[*module.header, *body[0].leading_lines])
      nodes += [(source.file_of(cls), statement) for statement in body]
  return nodes


def _with_constants(
    port: classes.ClassPort, constants: dict[str, str]
) -> list[tuple[source.SourceFile, cst.CSTNode]]:
  """A written class after the constants its fields' defaults need that
  `constants` (name -> value's code, which this adds them to) does not hold
  yet; a constant whose name another class's default of another value took
  is renamed, in the class too (`_<class>` appended)."""
  file = source.file_of(port.cls)
  node = port.node
  statements = []
  for constant in port.constants:
    code = cst.Module([]).code_for_node(constant.body[0].value)
    name = constant.body[0].targets[0].target.value
    new = name
    while constants.get(new, code) != code:  # another class's default of that name
      new += f'_{port.cls.__name__.lower()}'
    if new != name:
      node = node.visit(syntax.Substitute({name: new}))
      constant = constant.with_changes(body=[constant.body[0].with_changes(
          targets=[cst.AssignTarget(cst.Name(new))])])
    if new not in constants:
      constants[new] = code
      statements.append((file, constant))
  statements.append((file, node))
  return statements


class _Copies:
  """What the port copies of its classes' files, by what the classes read:
  helpers (functions that make layers as the classes' writers rewrote them),
  constants and imports; the user's classes it reads, imported as they are."""

  def __init__(self, ports, nodes: list[tuple[source.SourceFile, cst.CSTNode]], ported_names: set[str]):
    self.nodes = nodes
    self.ported_names = ported_names
    self.rewritten = {
        name: node for p in ports if isinstance(p, classes.ClassPort) for name, node in p.helpers.items()
    }
    self.chosen: dict[int, cst.CSTNode] = {}  # id(original statement) -> statement to write
    self.imported: list[str] = []  # the user's classes the port reads, imported

  def copy_from(self, file: source.SourceFile) -> None:
    """The statements of `file` that its classes read, written for NNX."""
    read = self._choose_definitions(file)
    needs_linen = self._write_for_nnx(file)
    for statement in file.module.body:
      if _is_import(statement):
        kept = _only_aliases(statement, read - self.ported_names)
        if kept is not None and (needs_linen or not _imports_linen(kept)):
          self.chosen[id(statement)] = kept

  def _choose_definitions(self, file: source.SourceFile) -> set[str]:
    """The names the file's classes read, and the definitions that read
    them, in turn; each definition not imported chosen."""
    defined = {}
    for statement in file.module.body:
      for name in syntax.bound_names(statement):
        defined[name] = statement  # the last binding: what the module holds
    wanted = set().union(*(source.free_names(n) for f, n in self.nodes if f is file))
    seen: set[str] = set()
    while wanted - seen:
      name = (wanted - seen).pop()
      seen.add(name)
      statement = defined.get(name)
      if statement is None or name in self.ported_names and not _is_import(statement):
        continue
      if _is_import(statement):
        continue  # chosen by `copy_from`, by alias
      if _imported_as_is(file, statement, name):
        self.imported.append(f'from {file.python_module.__name__} import {name}\n')
        continue
      self.chosen[id(statement)] = statement
      wanted |= source.free_names(self.rewritten.get(name, statement))
    return seen

  def _write_for_nnx(self, file: source.SourceFile) -> bool:
    """Every statement chosen so far written for NNX; whether the port
    still needs the file's Linen import."""
    # Helpers read Linen's names as NNX's where they are the same objects;
    # one that still needs Linen keeps its import.
    # A class or helper still calling Linen (`nn.with_logical_constraint`,
    # which NNX code calls as it is) keeps the Linen import.
    linen_names = file.linen_names | file.linen_bound.keys()
    needs_linen = any(
        syntax.names_in(n) & linen_names for f, n in self.nodes if f is file
    ) or any(syntax.names_in(n) & linen_names for n in self.rewritten.values())
    for key, statement in list(self.chosen.items()):
      if isinstance(statement, cst.FunctionDef) and statement.name.value in self.rewritten:
        self.chosen[key] = self.rewritten[statement.name.value]
        continue
      rewriter = references.LinenReferences(file, None, strict=False)
      self.chosen[key] = statement.visit(rewriter)
      needs_linen |= bool(rewriter.left)
    return needs_linen


def _copied_code(files: list[source.SourceFile], chosen: dict[int, cst.CSTNode]) -> tuple[list[str], list[str]]:
  """The code of the statements `chosen`, in their files' order: the
  imports (each once, `from __future__` left out), and the rest, spaced as
  PEP 8 spaces them."""
  imports: list[str] = []
  helpers: list[tuple[bool, str]] = []  # (a function or class, its code)
  for file in files:
    for statement in file.module.body:
      if id(statement) not in chosen:
        continue
      written = chosen[id(statement)]
      code = file.module.code_for_node(
          written.with_changes(leading_lines=[] if _is_import(written) else _comments(written))
      )
      if _is_import(written):
        if code.strip() != _FUTURE.strip() and code not in imports:
          imports.append(code)
      else:
        # PEP 8's spacing: two blank lines around a function or class, none
        # between constants written together in the source.
        is_def = isinstance(written, (cst.FunctionDef, cst.ClassDef))
        together = not is_def and helpers and not helpers[-1][0] and not any(
            line.comment is None for line in statement.leading_lines)
        helpers.append((is_def, ('\n\n' if is_def or (helpers and helpers[-1][0]) else '' if together else '\n') + code))
  return imports, [code for _, code in helpers]


def _imports(copied: list[str], imported: list[str], nodes) -> str:
  """The port's imports, standard library first: those `copied`, NNX, the
  user's classes `imported` as they are, and what the port's own code reads."""
  imports = [*copied, 'from flax import nnx\n', *imported]
  read = set().union(*(syntax.names_in(n) for _, n in nodes))
  if 'first_from' in read:
    imports.append('from flax.nnx.module import first_from\n')
  # What the port writes itself reads `jnp` (`init_cache`'s dtype), which
  # a Linen file importing it otherwise did not need to hand on.
  if 'jnp' in read and not any(
      re.search(r'\bas jnp\b', i) for i in imports):
    imports.append('import jax.numpy as jnp\n')
  return '\n' + ''.join(sorted(set(imports), key=_import_order))


def _mode_paragraph(modes: dict[str, bool] | None) -> str:
  """The docstring's word on the mode flags (`{flag: its training value}`)."""
  if not modes:
    return ''
  flags = ', '.join(f'`{flag}={not train}`' for flag, train in modes.items())
  return (f'A new model is in training mode, as every NNX module is: call `model.eval()` where '
          f'Linen ran with {flags}, `model.train()` to train.')


def _sown(ports) -> dict[str, str]:
  """The variable types of what the written classes sow, by collection."""
  sown: dict[str, str] = {}
  for port in ports:
    if isinstance(port, classes.ClassPort):
      sown.update(port.sown)
  return sown


def _paths_body(mapping: PathMapping, unmapped: list[tuple]) -> str:
  """The mapping's module below its docstring: `PATHS`, after a comment
  listing the variables under stubs it leaves out."""
  text = ''
  if unmapped:
    shown = [format_path(p) for p in unmapped[:_UNMAPPED_SHOWN]]
    more = len(unmapped) - len(shown)
    text += (
        f'# Left out while classes of the port are stubs: the {len(unmapped)} variables under them\n'
        + ''.join(f'#   {p}\n' for p in shown) + (f'#   ... and {more} more\n' if more else '')
        + '# Port the stubs, then map the whole model with `linen-nnx map`.\n'
    )
  if mapping.rules:
    return text + mapping.to_python('PATHS')
  return text + 'from converters import PathMapping\n\nPATHS = PathMapping([])\n'


def write_text(path: str, text: str) -> None:
  """`text` written to `path` whole or not at all (a temporary file beside
  it, then renamed): an existing symlink there is replaced, not followed
  (`--force` replaces the link, as `linen-nnx convert` does, never what it
  points to)."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, temporary = tempfile.mkstemp(dir=directory, prefix='.linen-nnx-', suffix='.tmp')
  try:
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      f.write(text)
    os.chmod(temporary, 0o666 & ~_umask())  # as `open` would make it, not mkstemp's 0600
    os.replace(temporary, path)
  except BaseException:
    os.unlink(temporary)
    raise


def _umask() -> int:
  """The process's umask: Linux says it (`/proc/self/status`); elsewhere it
  is read by setting it and setting it back (a moment another thread could see)."""
  try:
    with open('/proc/self/status', encoding='ascii') as f:
      return next(int(line.split()[1], 8) for line in f if line.startswith('Umask:'))
  except (OSError, StopIteration, ValueError):
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _comments(node) -> list:
  """A statement's leading lines from its first comment on."""
  lines = list(node.leading_lines)
  while lines and lines[0].comment is None:
    lines.pop(0)
  return lines


def _imports_linen(statement) -> bool:
  code = cst.Module([]).code_for_node(statement)
  return bool(re.search(r'\bflax\.linen\b|from flax import linen|import linen', code))


def _import_order(code: str) -> tuple:
  """Standard library first (ruff's isort orders the rest)."""
  module = code.split()[1]
  return (0 if module.split('.')[0] in sys.stdlib_module_names else 1, code)


# --- the path mapping


def path_pairs(
    root: tracing.Created, variables: dict, ports: dict[type, classes.ClassPort]
) -> list[tuple[tuple, tuple, tuple[int, int, int] | Counted | None, tuple | None]]:
  """`(linen path, nnx path, index, fused)` of every variable below a collection
  (`('Conv_0', 'kernel')`), where `index` is `(linen position, nnx position,
  number of the loop's first layer)` of a looped layer's index that `{i}`
  (`{i+1}`) can stand for, or the `Counted` place of a layer Linen numbers
  after a loop's, and `fused` is `(pattern, part)` for a part of a variable
  NNX holds fused (None else)."""
  modules: dict[tuple, tuple[tuple, tuple[int, int, int] | Counted | None]] = {(): ((), None)}
  placed = {id(root): modules[()]}  # each module the walk maps -> (nnx path, index)
  # The variables of a module sharing its parent's scope (`nn.share_scope`):
  # Linen's path (the parent's) -> (the NNX path, in the module's attribute, index).
  shared: dict[tuple, tuple[tuple, tuple[int, int, int] | Counted | None]] = {}
  renames: dict[tuple, dict[str, str]] = {(): _variable_attributes(ports.get(root.cls))}
  fused: dict[tuple, tuple[tuple, str, int]] = {}  # linen path -> (nnx name, pattern, part)
  stubbed = _stubbed(root, ports)
  for instance in root.walk():
    port = ports.get(instance.cls)
    if port is None or isinstance(port, StubPort) or id(instance) not in placed:
      continue  # a Flax layer; a stub, or a module under one: not mapped
    parent_nnx, parent_index = placed[id(instance)]
    numbered = _loop_numbering(instance, port.placement) if parent_index is None else {}
    for child in instance.children:
      nnx_path = parent_nnx + port.placement.nnx_path(child)
      index = parent_index
      if child.shares_scope:
        placed[id(child)] = (nnx_path, index)
        own = dict(getattr(layers.layer_spec(child.cls), 'variable_renames', ())) or _variable_attributes(
            ports.get(child.cls))
        shared.update({child.path + (name,): (nnx_path + (own.get(name, name),), index) for name in child.reserved})
        continue
      if isinstance(numbered.get(child.path), Counted):
        index = numbered[child.path]
      elif child.path in numbered:  # `(linen position, nnx position, first number)`
        index = (len(child.path) - 1, len(parent_nnx) + port.placement.loop_index_at(child), numbered[child.path])
      modules[child.path] = placed[id(child)] = (nnx_path, index)
      spec = layers.layer_spec(child.cls)
      renames[child.path] = dict(getattr(spec, 'variable_renames', ())) or _variable_attributes(
          ports.get(child.cls))
      for nnx_name, parts, pattern in getattr(spec, 'fused_variables', ()):
        for k, part in enumerate(parts):
          fused[child.path + tuple(part.split('/'))] = (tuple(nnx_name.split('/')), pattern, k)
  _held_first(root, ports, modules)
  pairs = []
  for collection, tree in variables.items():
    flat = _flatten(tree)
    for path in flat:
      if any(path[:k] in stubbed for k in range(len(path))):
        continue
      if path in shared:
        pairs.append((path, *shared[path], None))
        continue
      for cut in range(len(path), -1, -1):
        if path[:cut] in modules:
          nnx_prefix, index = modules[path[:cut]]
          if cut == len(path):
            continue
          rest = path[cut:]
          if path in fused:  # `ii/kernel`, part 0 of `dense_i/kernel`
            name, pattern, part = fused[path]
            pairs.append((path, nnx_prefix + name, index, (pattern, part)))
            break
          rest = (renames[path[:cut]].get(rest[0], rest[0]),) + rest[1:]  # `if` -> `if_`
          pairs.append((path, nnx_prefix + rest, index, None))
          break
      else:
        raise LookupError(f'{collection}/{format_path(path)} belongs to no module the port wrote')
  return list(dict.fromkeys(pairs))


@dataclasses.dataclass(frozen=True)
class Counted:
  """A layer Linen numbers after a loop's: `after` layers past it
  (`Dense_{n+after}`), its key at `position` of the Linen path."""

  position: int
  after: int


#: A numbered name, Linen's (`Dense_3`) or the user's (`block3`): its prefix and number.
_NUMBERED = re.compile(r'(.*?)(\d+)')


def _variable_attributes(port) -> dict[str, str]:
  """The NNX attributes of a written class's variables that its Linen
  names differ from (`setup()`'s `self.table = self.param('embedding', ...)`)."""
  return dict(port.placement.variable_attributes) if isinstance(port, classes.ClassPort) else {}


def _held_first(root: tracing.Created, ports, modules: dict) -> None:
  """A module a field hands on (`Encoder(shared_embedding=self.shared_embedding)`,
  one embedding for the encoder and the decoder) is one NNX module held by
  several attributes, and NNX keeps its variables where its traversal, in
  sorted key order, meets it first (`decoder/shared_embedding`, not
  `shared_embedding`): `modules` moved there, the module and all below it."""
  held: dict[tuple, list[tuple]] = {}
  for instance in root.walk():
    if instance.path not in modules or not isinstance(ports.get(instance.cls), classes.ClassPort):
      continue
    for field in shapes.module_fields(instance.module):
      value = getattr(instance.module, field, None)
      if not isinstance(value, nn.Module) or value.scope is None:
        continue
      path = tuple(value.path)
      if path in modules and path != instance.path + (field,) and _keeps(ports[instance.cls], field):
        held.setdefault(path, []).append(modules[instance.path][0] + (field,))
  for linen, others in held.items():
    own = modules[linen][0]
    first = min([own, *others], key=lambda p: tuple((isinstance(k, str), k) for k in p))
    if first == own:
      continue
    for path, (nnx_path, index) in list(modules.items()):
      if path[:len(linen)] == linen:
        modules[path] = (first + nnx_path[len(own):], index)


def _keeps(port: classes.ClassPort, field: str) -> bool:
  """Whether the written class keeps `field` as an attribute (`self.emb =
  emb`), not only hands it on to the modules it builds."""
  return any(
      isinstance(n, cst.Assign) and any(syntax.self_attribute(t.target) == field for t in n.targets)
      for n in syntax.descendants(port.node))


def _stubbed(root: tracing.Created, ports) -> set[tuple]:
  """The paths of the modules the port holds as stubs."""
  return {i.path for i in root.walk() if isinstance(ports.get(i.cls), StubPort)}


def under_stubs(root: tracing.Created, variables: dict, ports) -> list[tuple]:
  """The paths of the variables under a stub (its own and its modules'):
  what `PATHS` leaves out until the stub is ported."""
  stubbed = _stubbed(root, ports)
  return [
      path for tree in variables.values() for path in _flatten(tree)
      if any(path[:k] in stubbed for k in range(len(path)))
  ]


def _loop_numbering(instance: tracing.Created, placed: placement.Placement) -> dict[tuple, int | Counted]:
  """How the children of `instance` are numbered for any loop length: the
  number of the loop's first layer for a looped layer (`Dense_{i}`,
  `Dense_{i+1}` after one `Dense` made before the loop), a `Counted` for a
  layer made after the loop (`Dense_{n}`). Only where every other `Dense`
  is made once, before or after the loop; else all keep their numbers."""
  site_of = {id(c): placed.site_of(c) for c in instance.children}
  sites: dict = {}
  for child in instance.children:
    sites.setdefault(site_of[id(child)], []).append(child)
  numbered = {}
  for site, siblings in sites.items():
    if not placed.made_in_loop(site):
      continue
    numbered_name = _NUMBERED.fullmatch(siblings[0].name)
    if numbered_name is None:
      continue
    prefix, first = numbered_name[1], int(numbered_name[2])
    if not all(c.name == f'{prefix}{first + k}' for k, c in enumerate(siblings)):
      continue
    others = [c for c in instance.children if site_of[id(c)] != site
              and re.fullmatch(rf'{re.escape(prefix)}\d+', c.name)]
    numbers = sorted(int(_NUMBERED.fullmatch(c.name)[2]) for c in others)
    once = all(len(sites[site_of[id(c)]]) == 1 and not placed.made_in_loop(site_of[id(c)]) for c in others)
    # Linen counts a class's modules from 0 in each scope (`Dense_1` in the
    # loop after `Dense_0` before it); a user's names count from their own
    # first number (`block1`, or `unit2` in the loop after `unit1` before it).
    below = [k for k in numbers if k < first]
    if not once or numbers and below not in (list(range(first)), list(range(1, first))):
      continue  # another loop of them, or a gap: numbered as traced
    numbered.update(dict.fromkeys((c.path for c in siblings), first))
    end = first + len(siblings)
    numbered.update({c.path: Counted(len(c.path) - 1, int(_NUMBERED.fullmatch(c.name)[2]) - end)
                     for c in others if int(_NUMBERED.fullmatch(c.name)[2]) >= end})
  return numbered


def _flatten(tree, prefix=()) -> list[tuple]:
  if isinstance(tree, dict) or hasattr(tree, 'items'):
    return [p for k, v in tree.items() for p in _flatten(v, prefix + (k,))]
  return [prefix]


def mapping_of(pairs) -> PathMapping:
  """One rule per variable, written once for every index of a looped layer;
  one rule for the parts NNX holds in one variable (`PathRule((...'ii/kernel',
  ...), '.../dense_i/kernel', transform=Rearrange('i h -> i (gate h)'))`)."""
  rules, seen = [], set()
  parts: dict[tuple, dict[int, str]] = {}  # (nnx template, pattern) -> part -> linen template
  for linen, nnx_path, index, fused in pairs:
    if isinstance(index, Counted):
      prefix = _NUMBERED.fullmatch(linen[index.position])[1]
      count = '{n}' if not index.after else f'{{n+{index.after}}}'
      linen_t = format_path(linen[:index.position] + (f'{prefix}{count}',) + linen[index.position + 1:])
      nnx_t = format_path(nnx_path)
    elif index is not None:
      li, ni, first = index
      token = f'{{i+{first}}}' if first else '{i}'
      linen_t = format_path(linen[:li] + (re.sub(r'\d+$', token, linen[li]),) + linen[li + 1:])
      nnx_t = format_path(nnx_path[:ni] + ('{i}',) + nnx_path[ni + 1:])
    else:
      linen_t, nnx_t = format_path(linen), format_path(nnx_path)
    if fused is not None:
      pattern, part = fused
      if (nnx_t, pattern) not in parts:
        parts[(nnx_t, pattern)] = {}
        rules.append((nnx_t, pattern))  # its place, filled below
      parts[(nnx_t, pattern)][part] = linen_t
    elif (linen_t, nnx_t) not in seen:
      seen.add((linen_t, nnx_t))
      rules.append(PathRule(linen_t, nnx_t))
  for k, rule in enumerate(rules):
    if isinstance(rule, tuple):
      nnx_t, pattern = rule
      found = parts[rule]
      rules[k] = PathRule(tuple(found[p] for p in sorted(found)), nnx_t, transform=Rearrange(pattern))
  return PathMapping(rules)


def unmapped_pairs(mapping: PathMapping, pairs) -> list[tuple[tuple, tuple]]:
  """The `(linen path, nnx path)` of `pairs` (`path_pairs` of one
  configuration) that `mapping` does not map onto each other, either way,
  bound to that configuration's paths on the side converted from."""
  wrong = []
  for side, framework in enumerate(('linen', 'nnx')):
    try:
      bound = mapping.bound(framework, [pair[side] for pair in pairs])
    except PathMappingError:
      return [(linen, nnx_path) for linen, nnx_path, *_ in pairs]
    for pair in pairs:
      part = pair[3][1] if pair[3] is not None else 0  # a part of a variable NNX holds fused
      found = bound.match_all(framework, pair[side])
      if framework == 'linen':
        mapped = [format_path(m.rule.path('nnx', m.layout, m.index)) for m in found if m.part == part]
      else:
        mapped = [format_path(m.rule.path('linen', m.layout, m.index, part)) for m in found]
      if mapped != [format_path(pair[1 - side])] and (pair[0], pair[1]) not in wrong:
        wrong.append((pair[0], pair[1]))
  return wrong


def _ruff_executable() -> list[str]:
  """ruff's own binary (`python -m ruff` starts a Python process more at
  every check, 50 ms); `python -m ruff` where ruff is not installed, which
  fails as `_ruff` expects."""
  try:
    from ruff.__main__ import find_ruff_bin

    return [os.fsdecode(find_ruff_bin())]
  except (ImportError, FileNotFoundError):
    return [sys.executable, '-m', 'ruff']


_RUFF = [*_ruff_executable(), 'check', '--isolated', '--quiet', '--no-cache']


def _ruff(arguments: list[str]) -> subprocess.CompletedProcess:
  """ruff run on `arguments`; exit 0 (clean) and 1 with findings are its
  answers, anything else (not installed: Python's own exit 1, a crash)
  refused: a check that did not run never passes."""
  result = subprocess.run(_RUFF + arguments, capture_output=True, text=True, check=False)
  if not (result.returncode == 0 or result.returncode == 1 and result.stdout.strip()):
    said = (result.stderr.strip() or result.stdout.strip() or f'exit {result.returncode}').splitlines()[-1]
    raise PortToolError(f'ruff could not check the port ({said}); install it: {PORT_INSTALL_HINT}')
  return result


def _findings(paths: list[str]) -> list[str]:
  result = _ruff(['--output-format', 'concise', *paths])
  return [line for line in result.stdout.splitlines() if line.strip()]


def _finding_kind(line: str) -> str:
  """`UP031` of `path:12:5: UP031 Use format ...`: the rule (the port may
  keep fewer of the names a finding of the source lists)."""
  return line.split(': ', 1)[-1].split(' ', 1)[0]


def ruff_check(path: str, sources: list[str] = ()) -> tuple[list[str], list[str]]:
  """Fixes what ruff fixes safely (import order, unused imports) in the
  written file, then what it still reports with its default rules, one line
  each: `(findings, kept)`, where `kept` are findings of a kind the Linen
  `sources` have too (the user's own code, copied as it is; reported, not
  the port's doing). The sources are read, never fixed."""
  _ruff(['--fix', '--select', 'F401,I', path])
  findings = _findings([path])
  theirs = {_finding_kind(line) for line in _findings(list(sources))} if sources and findings else set()
  return ([f for f in findings if _finding_kind(f) not in theirs],
          [f for f in findings if _finding_kind(f) in theirs])

