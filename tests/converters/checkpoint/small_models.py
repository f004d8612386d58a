"""Small user models for the checkpoint tool's hostile cases, as a user's module.

`linen_mlp` / `nnx_mlp` (with dropout, so the NNX port carries RNG state), a
model with a collection of its own (`counters`, NNX `Counter` Variables), and
models whose annotations the ('data', 'model') mesh cannot resolve: mesh
axes it lacks, and a logical name the rules lack; and Flax's `SpectralNorm`,
whose `batch_stats` keys are `'Dense_0/kernel/u'` in Linen and the tuple
`('kernel', 'u')` in NNX.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import nnx

from converters import LinenModel, PathMapping, PathRule

X = jax.ShapeDtypeStruct((2, 8), jnp.float32)
PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'up/kernel'), PathRule('Dense_0/bias', 'up/bias'),
    PathRule('Dense_1/kernel', 'down/kernel'), PathRule('Dense_1/bias', 'down/bias'),
])


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dropout(0.5, deterministic=not train)(nn.relu(nn.Dense(16)(x)))
    return nn.Dense(4)(x)


class NNXMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(8, 16, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.down = nnx.Linear(16, 4, rngs=rngs)

  def __call__(self, x):
    return self.down(self.dropout(nnx.relu(self.up(x))))


def linen_mlp() -> LinenModel:
  return LinenModel(LinenMLP(), X)


def nnx_mlp() -> nnx.Module:
  return NNXMLP(nnx.Rngs(0))


def make_tx() -> optax.GradientTransformation:
  return optax.adam(1e-3)


def make_sgd() -> optax.GradientTransformation:
  """Plain SGD: an optimizer state with no arrays at all."""
  return optax.sgd(1e-2)


def make_injected() -> optax.GradientTransformation:
  """Hyperparameters in the optimizer state (float scalars beside the count)."""
  return optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=1e-4)


# -- a collection of the model's own -----------------------------------------------


class Counter(nnx.Variable):
  """How many times the model ran: a Linen 'counters' collection."""


class LinenCounting(nn.Module):
  @nn.compact
  def __call__(self, x):
    calls = self.variable('counters', 'calls', lambda: jnp.zeros((), jnp.int32))
    calls.value += 1
    return nn.Dense(4)(x)


class NNXCounting(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.calls = Counter(jnp.zeros((), jnp.int32))
    self.dense = nnx.Linear(8, 4, rngs=rngs)


def linen_counting() -> LinenModel:
  return LinenModel(LinenCounting(), X)


def nnx_counting() -> nnx.Module:
  return NNXCounting(nnx.Rngs(0))


COUNTING_PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'dense/kernel'), PathRule('Dense_0/bias', 'dense/bias'),
    PathRule('calls', 'calls'),
])
COLLECTIONS = {'counters': Counter}


# -- keys with slashes (Linen) and tuple keys (NNX) -------------------------------


class LinenSpectral(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.SpectralNorm(nn.Dense(4))(x, update_stats=train)


class NNXSpectral(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.SpectralNorm(nnx.Linear(8, 4, rngs=rngs), rngs=rngs)

  def __call__(self, x, train: bool = False):
    return self.dense(x, update_stats=train)


def linen_spectral() -> LinenModel:
  return LinenModel(LinenSpectral(), X)


def nnx_spectral() -> nnx.Module:
  return NNXSpectral(nnx.Rngs(0))


SPECTRAL_PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'dense/layer_instance/kernel'),
    PathRule('Dense_0/bias', 'dense/layer_instance/bias'),
    PathRule("SpectralNorm_0/'Dense_0/kernel/u'", "dense/batch_stats/('kernel', 'u')"),
    PathRule("SpectralNorm_0/'Dense_0/kernel/sigma'", "dense/batch_stats/('kernel', 'sigma')"),
])


# -- state only the port has: a table Linen computes on the fly ------------------


def sinusoid(length: int = 2, width: int = 8) -> jax.Array:
  position = jnp.arange(length)[:, None] / 10000 ** (jnp.arange(width)[None] / width)
  return jnp.sin(position)


class LinenTabled(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(4)(x + sinusoid())


class NNXTabled(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.table = sinusoid()  # a plain array attribute
    self.dense = nnx.Linear(8, 4, rngs=rngs)

  def __call__(self, x):
    return self.dense(x + self.table)


def linen_tabled() -> LinenModel:
  return LinenModel(LinenTabled(), X)


def nnx_tabled() -> nnx.Module:
  return NNXTabled(nnx.Rngs(0))


TABLED_PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'dense/kernel'), PathRule('Dense_0/bias', 'dense/bias'),
])


class NNXTableVariable(nnx.Module):
  """The table held in a bare `nnx.Variable`, as Flax maintainers' own ports hold
  positional encodings: state of no Linen collection, only the port has."""

  def __init__(self, rngs: nnx.Rngs):
    self.table = nnx.Variable(sinusoid())
    self.dense = nnx.Linear(8, 4, rngs=rngs)

  def __call__(self, x):
    return self.dense(x + self.table[...])


def nnx_table_variable() -> nnx.Module:
  return NNXTableVariable(nnx.Rngs(0))


class NNXFree(nnx.Module):
  """A port with no table at all (it computes it on the fly, as Linen does)."""

  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(8, 4, rngs=rngs)

  def __call__(self, x):
    return self.dense(x + sinusoid())


def nnx_tabled_free() -> nnx.Module:
  return NNXFree(nnx.Rngs(0))


#: A causal mask, as PixelCNN-style models give Flax's convolutions: numpy,
#: so that a model made abstractly keeps its shape.
MASK = np.tril(np.ones((3, 3), np.float32))[:, :, None, None] * np.ones((1, 1, 2, 4), np.float32)


class LinenMasked(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Conv(4, (3, 3), mask=MASK)(x).reshape(x.shape[0], -1)


class NNXMasked(nnx.Module):
  """Flax's `nnx.Conv` keeps the mask as an array attribute, which Linen's
  `nn.Conv` holds as a module field: state only the port has."""

  def __init__(self, rngs: nnx.Rngs):
    self.conv = nnx.Conv(2, 4, (3, 3), mask=MASK, rngs=rngs)

  def __call__(self, x):
    return self.conv(x).reshape(x.shape[0], -1)


def linen_masked() -> LinenModel:
  return LinenModel(LinenMasked(), jax.ShapeDtypeStruct((2, 5, 5, 2), jnp.float32))


def nnx_masked() -> nnx.Module:
  return NNXMasked(nnx.Rngs(0))


class LinenBuffered(nn.Module):
  """Keeps the table in a collection of its own, which its port computes on the fly."""

  @nn.compact
  def __call__(self, x):
    table = self.variable('consts', 'table', sinusoid)
    return nn.Dense(4)(x + table.value)


def linen_buffered() -> LinenModel:
  return LinenModel(LinenBuffered(), X)


#: The table is the Linen model's own.
BUFFERED_PATHS = TABLED_PATHS + [PathRule.linen_only('table')]


class PositionTable(nnx.Variable):
  """A Variable type of the user's own, for a table an optimizer may train."""


class NNXLearnedTable(NNXTableVariable):
  def __init__(self, rngs: nnx.Rngs):
    super().__init__(rngs)
    self.table = PositionTable(sinusoid())


#: The table is the port's own: kept from a target, left out of a source.
TABLE_VARIABLE_PATHS = TABLED_PATHS + [PathRule.nnx_only('table')]


# -- annotations the mesh cannot resolve -------------------------------------------

KERNEL_NAMES = ('embed', 'mlp')


class LinenAnnotated(nn.Module):
  names: tuple = KERNEL_NAMES
  logical: bool = True

  @nn.compact
  def __call__(self, x):
    wrap = nn.with_logical_partitioning if self.logical else nn.with_partitioning
    return nn.Dense(16, kernel_init=wrap(nn.initializers.lecun_normal(), self.names))(x)


class NNXAnnotated(nnx.Module):
  def __init__(self, names, rngs: nnx.Rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), names)
    self.dense = nnx.Linear(8, 16, kernel_init=init, rngs=rngs)


ANNOTATED_PATHS = PathMapping([
    PathRule('Dense_0/kernel', 'dense/kernel'), PathRule('Dense_0/bias', 'dense/bias'),
])


# -- one attention over tokens: a query and a key alike on constant tokens ----


class LinenTokenAttention(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(16, 8, name='embed')(tokens)
    q, k, v = (nn.Dense(8, name=name)(x) for name in ('query', 'key', 'value'))
    weights = nn.softmax(q @ jnp.swapaxes(k, -1, -2) / jnp.sqrt(8.0))
    return (weights @ v).reshape(tokens.shape[0], -1)


class NNXTokenAttention(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(16, 8, rngs=rngs)
    self.q = nnx.Linear(8, 8, rngs=rngs)
    self.k = nnx.Linear(8, 8, rngs=rngs)
    self.v = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    weights = nnx.softmax(self.q(x) @ jnp.swapaxes(self.k(x), -1, -2) / jnp.sqrt(8.0))
    return (weights @ self.v(x)).reshape(tokens.shape[0], -1)


def linen_token_attention() -> LinenModel:
  # Constant tokens, the usual input of an init: the example as users give it.
  return LinenModel(LinenTokenAttention(), jnp.zeros((2, 6), jnp.int32))


def nnx_token_attention() -> nnx.Module:
  return NNXTokenAttention(nnx.Rngs(0))


class LinenKeywordAttention(LinenTokenAttention):
  """Called as Flax's examples call their models: `apply(v, tokens=..., train=False)`."""

  def __call__(self, *, tokens, train: bool):
    return super().__call__(tokens)


class NNXKeywordAttention(NNXTokenAttention):
  def __call__(self, *, tokens):
    return super().__call__(tokens)


def linen_keyword_attention() -> LinenModel:
  return LinenModel(LinenKeywordAttention(), tokens=jnp.zeros((2, 6), jnp.int32), train=False)


def linen_abstract_keyword_attention() -> LinenModel:
  return LinenModel(LinenKeywordAttention(), tokens=jax.ShapeDtypeStruct((2, 6), jnp.int32), train=False)


def nnx_keyword_attention() -> nnx.Module:
  return NNXKeywordAttention(nnx.Rngs(0))


def _attention_paths(query: str, key: str) -> PathMapping:
  return PathMapping([
      PathRule('embed/embedding', 'embed/embedding'),
      *(PathRule(f'{linen}/{leaf}', f'{port}/{leaf}')
        for linen, port in (('query', query), ('key', key), ('value', 'v'))
        for leaf in ('kernel', 'bias')),
  ])


ATTENTION_PATHS = _attention_paths('q', 'k')
#: Query and key swapped: alike on constant tokens, wrong on any other.
SWAPPED_ATTENTION_PATHS = _attention_paths('k', 'q')


class NNXFailing(NNXMLP):
  """A port whose call fails (a shape its author got wrong)."""

  def __call__(self, x):
    return super().__call__(x.reshape(-1))


def nnx_failing() -> nnx.Module:
  return NNXFailing(nnx.Rngs(0))


# -- two kernels summed, one behind dropout: alike in eval mode ----------------


class LinenDropoutBranch(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    a = nn.Dense(4, use_bias=False, name='a')(x)
    return a + nn.Dropout(0.5, deterministic=not train)(nn.Dense(4, use_bias=False, name='b')(x))


class NNXDropoutBranch(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.p = nnx.Linear(8, 4, use_bias=False, rngs=rngs)
    self.q = nnx.Linear(8, 4, use_bias=False, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.q(x) + self.drop(self.p(x))


def linen_dropout_branch() -> LinenModel:
  return LinenModel(LinenDropoutBranch(), X, train=False)


def nnx_dropout_branch() -> nnx.Module:
  return NNXDropoutBranch(nnx.Rngs(0))


BRANCH_PATHS = PathMapping([PathRule('a/kernel', 'q/kernel'), PathRule('b/kernel', 'p/kernel')])
#: The dropout moved to the other kernel: alike in eval mode only.
SWAPPED_BRANCH_PATHS = PathMapping([PathRule('a/kernel', 'p/kernel'), PathRule('b/kernel', 'q/kernel')])


# -- dropout given its flag at the call, a port under nnx.remat ---------------


class LinenCallFlag(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.Dropout(0.5)(nn.relu(nn.Dense(16)(x)), deterministic=not train)
    return nn.Dense(4)(h)


class NNXRematMLP(NNXMLP):
  def __call__(self, x):
    return nnx.remat(lambda m, x: m.down(m.dropout(nnx.relu(m.up(x)))))(self, x)


def linen_call_flag() -> LinenModel:
  return LinenModel(LinenCallFlag(), X, train=False)


def nnx_remat_mlp() -> nnx.Module:
  return NNXRematMLP(nnx.Rngs(0))


class LinenArgmax(nn.Module):
  """Integer outputs: nothing to differentiate."""

  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(16)(x))
    return jnp.argmax(nn.Dense(4)(h), axis=-1)


class NNXArgmax(NNXMLP):
  def __call__(self, x):  # no dropout, as the original
    return jnp.argmax(self.down(nnx.relu(self.up(x))), axis=-1)


def linen_argmax() -> LinenModel:
  return LinenModel(LinenArgmax(), X)


def nnx_argmax() -> nnx.Module:
  return NNXArgmax(nnx.Rngs(0))
