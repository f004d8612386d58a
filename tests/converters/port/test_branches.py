"""`converters.port.branches`: which side of an `if` no traced configuration
took, and what is written in its place."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import libcst as cst
from flax import linen as nn

from converters.port import branches, source, syntax, tracing


class Root(nn.Module):
  stem: int | None = None
  width: int = 4

  @nn.compact
  def __call__(self, x):
    if self.stem is not None:
      x = nn.Conv(self.stem, (3, 3))(x)
    else:
      x = x * 2
    if x.shape[-1] > 100:  # a test of the inputs: never untraced
      x = nn.Dense(self.width)(x)
    return nn.Dense(self.width)(x)


def _read(module):
  root, _ = tracing.trace(module, jax.ShapeDtypeStruct((2, 3), jnp.float32))
  file = source.file_of(Root)
  method = next(s for s in file.class_def(Root).body.body if isinstance(s, cst.FunctionDef))
  calls = [n for n in syntax.descendants(method) if isinstance(n, cst.Call)
           and file.code(n.func) in ('nn.Conv', 'nn.Dense')]
  return root, file, method, calls


def test_the_side_no_instance_takes_is_untraced_and_raises_saying_why():
  root, file, method, (conv, dense_in_branch, dense) = _read(Root())
  made = {file.call_at(c.site) for c in root.children}
  assert made == {dense}
  branch = branches.untraced_branch(conv, method, file, [root], {'x'}, made)
  assert branch is not None and not branch.is_else
  assert branch.test(file) == 'self.stem is not None'
  assert branch.line(file) == file.line_of(branch.statement)
  raised = cst.Module([]).code_for_node(branch.raising('Root', file))
  assert 'raise NotImplementedError(' in raised
  assert 'Root: the if branch of `if self.stem is not None` was not traced' in raised
  # A test that reads the inputs says nothing of the configuration.
  assert branches.untraced_branch(dense_in_branch, method, file, [root], {'x'}, made) is None


def test_a_side_some_instance_takes_is_not_untraced():
  root, file, method, (conv, *_) = _read(Root())
  taken, _ = tracing.trace(Root(stem=5), jax.ShapeDtypeStruct((2, 4, 4, 3), jnp.float32))
  assert branches.untraced_branch(conv, method, file, [root, taken], {'x'}, set()) is None
  statement = next(a for a in file.ancestors(conv) if isinstance(a, cst.If))
  assert branches.never_taken(statement, True, file, [root])
  assert not branches.never_taken(statement, True, file, [taken])
  assert not branches.never_taken(statement, False, file, [root])


def test_a_side_refused_for_a_configuration_the_proof_adds_raises_saying_why():
  root, file, method, (conv, *_) = _read(Root())
  taken, _ = tracing.trace(Root(stem=5), jax.ShapeDtypeStruct((2, 4, 4, 3), jnp.float32))
  branch = branches.untraced_branch(conv, method, file, [root], {'x'}, set())
  assert branches.taken_by(branch, file, taken) and not branches.taken_by(branch, file, root)
  refused = dataclasses.replace(branch, refused='nn.remat of a module without nn.scan; port it by hand')
  raised = cst.Module([]).code_for_node(refused.raising('Root', file))
  assert ('Root: the if branch of `if self.stem is not None` is not written: nn.remat of a module '
          'without nn.scan; port it by hand') in raised
  assert 'was not traced' not in raised
