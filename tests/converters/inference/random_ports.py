"""Random models, and random ports of them that change nothing the outputs see.

A `Program` is a small dataflow of square layers over one or two inputs:
dense kernels (one may be shared by several layers), biases, rows tiled over
the batch, sums, products, activations, concatenations and a choice on the
sign of the first input. `linen_model(program)` writes it as a Linen module;
`nnx_port(program, rewrite)` writes a port of it that a person might write:
its own names and nesting, another order of evaluation, operands of sums
and products swapped, a scale moved across a contraction, sharding
constraints added, removed or moved, `broadcast_to` for `tile`, and
parameters stored otherwise: kernels stored transposed (contracted by an
einsum or as `x @ w.T`), two kernels fused into one `(N, 2N)` parameter
sliced where each is used, a concatenation's `(2N, N)` kernel split in two
halves, each contracting one operand. Those need a transform: inference
must refuse them, or map them correctly. With modes, programs gate on a
boolean mask (which the example keeps all true), drop out in training and
reverse gradients: the port's layers are alike at the example and differ
only on other masks, in training or backward.

`Layers` repeats such a program as the block of a stack of layers: Linen
scans the block (`nn.scan`, its variables stacked) or loops over one
submodule a layer; the port scans it (`nnx.vmap` + `nnx.scan`) or loops over
an `nnx.List`, either with the layers rematerialized, and either in Linen's
order or run from the end of its stack (`reverse`: Linen's layer i is the
port's layer count-1-i, which no path rule says: inference must refuse, or
map each layer correctly).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

N = 4
BATCH = 8
ACTIVATIONS = {'relu': jax.nn.relu, 'tanh': jnp.tanh, 'sigmoid': jax.nn.sigmoid}


@dataclasses.dataclass(frozen=True)
class Node:
  """`kind` over earlier nodes `args`: 'input' (arg: which), 'dense' (param),
  'bias' (param), 'row' (param, tiled over the batch), 'add', 'mul',
  'act' (name), 'concat' (two nodes, then a (2N, N) kernel), 'choice';
  with modes: 'gate' (two nodes chosen elementwise by the boolean mask, the
  program's last input), 'drop' (dropout in training), 'reverse' (the
  identity whose gradient is negated)."""

  kind: str
  args: tuple[int, ...] = ()
  param: str | None = None
  extra: str | None = None


@dataclasses.dataclass(frozen=True)
class Program:
  inputs: int
  nodes: tuple[Node, ...]
  params: tuple[tuple[str, tuple[int, ...]], ...]  # name, shape
  gated: bool = False  # a boolean mask follows the float inputs


@jax.custom_vjp
def reverse_gradient(x):
  return x


reverse_gradient.defvjp(lambda x: (x, None), lambda _, g: (-g,))


@dataclasses.dataclass(frozen=True)
class Rewrite:
  names: tuple[tuple[str, tuple[str, ...]], ...]  # Linen name -> NNX path
  order: tuple[int, ...]  # evaluation order of the nodes (topological)
  swapped: frozenset[int]  # sums and products written the other way round
  scaled: frozenset[int]  # dense nodes whose x2 moves before the contraction
  constrained: frozenset[int]  # nodes the port constrains
  transposed: frozenset[str]  # kernels stored (out, in)
  in_call: frozenset[str] = frozenset()  # of those, used as `x @ w.T` (else an einsum)
  fused: tuple[str, ...] = ()  # two kernels stored as one (N, 2N), stored under the first's path
  split: frozenset[str] = frozenset()  # concatenations' kernels stored as two (N, N) halves
  linen_constrained: frozenset[int] = frozenset()  # nodes the original constrains

  @property
  def reshaped(self) -> bool:
    """Whether a parameter is stored in another layout (its rule needs a transform)."""
    return bool(self.transposed or self.fused or self.split)


@dataclasses.dataclass(frozen=True)
class Layers:
  count: int
  linen_scan: bool  # else one submodule a layer
  nnx_scan: bool  # else an nnx.List
  remat: bool  # on both sides
  reverse: bool  # the port runs its layers from the end of its stack


@st.composite
def programs(draw, inputs: st.SearchStrategy[int] = st.integers(1, 2), modes: bool = False) -> Program:
  """Random programs; with `modes`, also gates on a boolean mask, dropout
  and gradient reversals (what only other inputs, training or a pass
  backward tell apart)."""
  inputs = draw(inputs)
  nodes = [Node('input', (), extra=str(i)) for i in range(inputs)]
  params: dict[str, tuple[int, ...]] = {}
  kernels: list[str] = []
  kinds = ['dense', 'dense', 'bias', 'row', 'add', 'mul', 'act', 'concat', 'choice']
  if modes:
    kinds += ['gate', 'gate', 'drop', 'drop', 'reverse']
  for step in range(draw(st.integers(2, 7))):
    kind = 'dense' if step == 0 else draw(st.sampled_from(kinds))
    pick = lambda: draw(st.integers(0, len(nodes) - 1))
    if kind == 'dense':
      if kernels and draw(st.booleans()) and draw(st.booleans()):
        name = draw(st.sampled_from(kernels))  # a shared kernel
      else:
        name = f'w{len(params)}'
        params[name] = (N, N)
        kernels.append(name)
      nodes.append(Node('dense', (pick(),), name, extra=draw(st.sampled_from(['', 'scaled']))))
    elif kind in ('bias', 'row'):
      name = f'b{len(params)}'
      params[name] = (N,) if kind == 'bias' else (1, N)
      nodes.append(Node(kind, (pick(),), name))
    elif kind in ('add', 'mul', 'choice', 'gate'):
      nodes.append(Node(kind, (pick(), pick())))
    elif kind in ('drop', 'reverse'):
      nodes.append(Node(kind, (pick(),)))
    elif kind == 'act':
      nodes.append(Node('act', (pick(),), extra=draw(st.sampled_from(sorted(ACTIVATIONS)))))
    else:
      name = f'c{len(params)}'
      params[name] = (2 * N, N)
      nodes.append(Node('concat', (pick(), pick()), name))
  # every parameter reaches the output: the last node sums every leaf
  used = {a for n in nodes for a in n.args}
  leaves = [k for k in range(inputs, len(nodes)) if k not in used] or [len(nodes) - 1]
  for k in leaves[1:]:
    nodes.append(Node('add', (len(nodes) - 1 if len(nodes) - 1 != k else leaves[0], k)))
  return Program(inputs, tuple(nodes), tuple(params.items()), any(n.kind == 'gate' for n in nodes))


@st.composite
def rewrites(draw, program: Program, transposes: bool = True) -> Rewrite:
  names = []
  for k, (name, _) in enumerate(program.params):
    depth = draw(st.integers(0, 2))
    nesting = tuple(draw(st.sampled_from(['blk', 'sub', 'm'])) + str(k) for _ in range(depth))
    names.append((name, nesting + (draw(st.sampled_from(['kernel', 'weight', 'p'])) + str(k),)))
  order = list(range(program.inputs))
  waiting = list(range(program.inputs, len(program.nodes)))
  drops = [k for k, n in enumerate(program.nodes) if n.kind == 'drop']
  while waiting:  # a random topological order, drawing its dropout masks in the original's order
    ready = [
        k for k in waiting if all(a in order for a in program.nodes[k].args)
        and all(d in order for d in drops if d < k and program.nodes[k].kind == 'drop')
    ]
    k = draw(st.sampled_from(ready))
    order.append(k)
    waiting.remove(k)
  commutative = [k for k, n in enumerate(program.nodes) if n.kind in ('add', 'mul', 'gate')]
  scaled = [k for k, n in enumerate(program.nodes) if n.extra == 'scaled']
  kernels = [name for name, shape in program.params if shape == (N, N)]
  transposed = frozenset(draw(st.sets(st.sampled_from(kernels))) if kernels and transposes else ())
  in_call = frozenset(draw(st.sets(st.sampled_from(sorted(transposed)))) if transposed else ())
  nodes = st.sets(st.sampled_from(range(len(program.nodes))))
  swaps = frozenset(draw(st.sets(st.sampled_from(commutative))) if commutative else ())
  scales = frozenset(draw(st.sets(st.sampled_from(scaled))) if scaled else ())
  constrained = frozenset(draw(nodes))
  stored_as_is = [name for name in kernels if name not in transposed]
  fused = ()
  if transposes and len(stored_as_is) >= 2 and draw(st.integers(0, 3)) == 0:
    fused = tuple(draw(st.permutations(stored_as_is))[:2])
  concatenations = [name for name, shape in program.params if shape == (2 * N, N)]
  split = frozenset()
  if transposes and concatenations and draw(st.integers(0, 3)) == 0:
    split = frozenset(draw(st.sets(st.sampled_from(concatenations), min_size=1)))
  return Rewrite(
      tuple(names), tuple(order), swaps, scales, constrained, transposed, in_call, fused, split,
      frozenset(draw(nodes)),
  )


def layers() -> st.SearchStrategy[Layers]:
  # One port in four runs its stack from the end: mostly refused, so the
  # rest of the draws go to ports that must map.
  reverse = st.sampled_from([False, False, False, True])
  return st.builds(Layers, st.integers(2, 3), st.booleans(), st.booleans(), st.booleans(), reverse)


def _evaluate(program: Program, order, inputs, get, *, swapped=frozenset(), scaled=frozenset(),
              constrained=frozenset(), transposed=frozenset(), in_call=frozenset(),
              split=frozenset(), tile=True, drop=None):
  if program.gated:
    inputs, mask = inputs[:-1], inputs[-1]
  values = {}
  for k in order:
    node = program.nodes[k]
    a = [values[x] for x in node.args]
    if node.kind == 'input':
      v = inputs[int(node.extra)]
    elif node.kind == 'dense':
      w = get(node.param)
      if node.extra == 'scaled' and k in scaled:
        v = _dense(a[0] * 2.0, w, node.param in transposed, node.param in in_call)
      else:
        v = _dense(a[0], w, node.param in transposed, node.param in in_call)
        v = v * 2.0 if node.extra == 'scaled' else v
    elif node.kind == 'bias':
      v = a[0] + get(node.param)
    elif node.kind == 'row':
      row = get(node.param)
      rows = jnp.tile(row, (BATCH, 1)) if tile else jnp.broadcast_to(row, (BATCH, N))
      v = a[0] + rows
    elif node.kind in ('add', 'mul'):
      x, y = (a[1], a[0]) if k in swapped else (a[0], a[1])
      v = x + y if node.kind == 'add' else x * y
    elif node.kind == 'act':
      v = ACTIVATIONS[node.extra](a[0])
    elif node.kind == 'concat' and node.param in split:
      v = a[0] @ get(node.param + '/top') + a[1] @ get(node.param + '/bottom')
    elif node.kind == 'concat':
      v = jnp.concatenate([a[0], a[1]], axis=-1) @ get(node.param)
    elif node.kind == 'gate':  # the port may write where(mask, a, b) as where(~mask, b, a)
      v = jnp.where(~mask, a[1], a[0]) if k in swapped else jnp.where(mask, a[0], a[1])
    elif node.kind == 'drop':
      v = drop(a[0])
    elif node.kind == 'reverse':
      v = reverse_gradient(a[0])
    else:  # choice on the sign of the first input
      v = jnp.where(inputs[0] > 0, a[0], a[1])
    if k in constrained:
      v = jax.lax.with_sharding_constraint(v, P('data'))
    values[k] = v
  return values[len(program.nodes) - 1]


def _dense(x, w, transposed: bool, in_call: bool = False):
  if transposed:
    return x @ w.T if in_call else jnp.einsum('bi,oi->bo', x, w)
  return x @ w


def linen_model(program: Program, constrained: frozenset[int] = frozenset()) -> nn.Module:
  class RandomLinen(nn.Module):
    @nn.compact
    def __call__(self, *inputs, train: bool = False):
      params = {
          name: self.param(name, nn.initializers.normal(1.0), shape) for name, shape in program.params
      }
      return _evaluate(
          program, range(len(program.nodes)), inputs, params.__getitem__, constrained=constrained,
          drop=lambda v: nn.Dropout(0.5, deterministic=not train)(v),
      )

  return RandomLinen()


def linen_layers_model(
    program: Program, layers: Layers, constrained: frozenset[int] = frozenset()
) -> nn.Module:
  """`layers.count` layers whose block is `program` (one input: the carry)."""

  class Block(nn.Module):
    @nn.compact
    def __call__(self, h, _):
      params = {
          name: self.param(name, nn.initializers.normal(1.0), shape) for name, shape in program.params
      }
      values = _evaluate(
          program, range(len(program.nodes)), (h,), params.__getitem__, constrained=constrained
      )
      return values, None

  block = nn.remat(Block) if layers.remat else Block

  class RandomLinenLayers(nn.Module):
    @nn.compact
    def __call__(self, x):
      if layers.linen_scan:
        scan = nn.scan(
            block, variable_axes={'params': 0}, split_rngs={'params': True}, length=layers.count
        )
        return scan(name='layers')(x, None)[0]
      for i in range(layers.count):
        x = block(name=f'layers_{i}')(x, None)[0]
      return x

  return RandomLinenLayers()


class _Holder(nnx.Module):
  pass


def nnx_port(program: Program, rewrite: Rewrite, rngs: nnx.Rngs) -> nnx.Module:
  return _port_class(program, rewrite)(rngs)


def _port_class(program: Program, rewrite: Rewrite) -> type[nnx.Module]:
  names = dict(rewrite.names)

  def stored(name, shape):  # (path, shape) of each array the port stores for `name`
    path = names[name]
    if name in rewrite.split:
      return [(path[:-1] + (path[-1] + '_' + half,), (N, N)) for half in ('top', 'bottom')]
    if rewrite.fused and name == rewrite.fused[1]:
      return []
    if rewrite.fused and name == rewrite.fused[0]:
      return [(path, (N, 2 * N))]
    return [(path, shape[::-1] if name in rewrite.transposed else shape)]

  class RandomPort(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      for name, shape in program.params:
        for path, shape in stored(name, shape):
          owner = self
          for key in path[:-1]:
            if not hasattr(owner, key):
              setattr(owner, key, _Holder())
            owner = getattr(owner, key)
          setattr(owner, path[-1], nnx.Param(jax.random.normal(rngs.params(), shape)))
      if any(n.kind == 'drop' for n in program.nodes):
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def _read(self, path):
      owner = self
      for key in path:
        owner = getattr(owner, key)
      return owner[...]

    def get(self, name):
      if '/' in name:  # a half of a split kernel
        name, half = name.split('/')
        return self._read(names[name][:-1] + (names[name][-1] + '_' + half,))
      if rewrite.fused and name in rewrite.fused:
        first = rewrite.fused.index(name) * N
        return self._read(names[rewrite.fused[0]])[:, first:first + N]
      return self._read(names[name])

    def __call__(self, *inputs):
      return _evaluate(
          program, rewrite.order, inputs, self.get, swapped=rewrite.swapped,
          scaled=rewrite.scaled, constrained=rewrite.constrained,
          transposed=rewrite.transposed, in_call=rewrite.in_call, split=rewrite.split, tile=False,
          drop=lambda v: self.dropout(v),
      )

  return RandomPort


def nnx_layers_port(program: Program, rewrite: Rewrite, layers: Layers, rngs: nnx.Rngs) -> nnx.Module:
  """The port of `linen_layers_model(program, layers)`, its block rewritten by `rewrite`."""
  block = _port_class(program, rewrite)

  def step(x, layer):
    return layer(x)

  step = nnx.remat(step) if layers.remat else step

  class RandomLayersPort(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      if layers.nnx_scan:
        @nnx.split_rngs(splits=layers.count)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs):
          return block(rngs)

        self.layers = create(rngs)
      else:
        self.layers = nnx.List([block(rngs) for _ in range(layers.count)])

    def __call__(self, x):
      if layers.nnx_scan:
        run = nnx.scan(step, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, reverse=layers.reverse)
        return run(x, self.layers)
      for layer in reversed(self.layers) if layers.reverse else self.layers:
        x = step(x, layer)
      return x

  return RandomLayersPort(rngs)


def example_inputs(program: Program, seed: int = 10, mask=None) -> tuple:
  """Float inputs, and the mask of a gated program: all true unless given
  (as an example keeps everything), which hides every gate's other branch."""
  floats = tuple(
      jax.random.normal(jax.random.key(seed + i), (BATCH, N)) for i in range(program.inputs)
  )
  if not program.gated:
    return floats
  return floats + (jnp.ones((BATCH, N), bool) if mask is None else mask,)
