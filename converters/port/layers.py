"""Flax's Linen layers and the NNX layers a port writes for them.

A `LayerSpec` says how one Linen layer class is written in NNX: the NNX class,
the input size NNX takes first and Linen infers (`in_features` of `Linear`,
`num_features` of the norms), Linen fields renamed (`Dense.features` is
`Linear.out_features`), fields NNX takes when called rather than when built,
and the fields the module's mode sets (`deterministic`, `use_running_average`:
`model.train()` / `model.eval()` in NNX). Variable names inside the layers are
the same in both frameworks for every layer listed (`kernel`, `bias`, `scale`,
`embedding`, `mean`, `var`).
"""

from __future__ import annotations

import dataclasses
import inspect

from flax import linen as nn
from flax import nnx


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """How the Linen layer `linen` is written in NNX.

  Attributes:
    linen: the Linen class.
    nnx: the NNX class, spelled as the generated file writes it (`nnx.Linear`).
    in_features: the NNX argument taking the size Linen infers from the
      input's `feature_axis`, or None (`Embed`, `Dropout`).
    renames: Linen field -> NNX argument, where the names differ.
    mode: Linen field -> whether its True value is NNX's eval mode (fields
      the mode sets; a port leaves them to `model.train()` / `.eval()`).
    rngs: whether the NNX layer takes `rngs` (to make its variables or draw
      its randomness).
    out_features: the Linen field giving the size of the last output axis.
  """

  linen: type
  nnx: str
  in_features: str | None = None
  renames: tuple[tuple[str, str], ...] = ()
  mode: tuple[tuple[str, bool], ...] = ()
  rngs: bool = True
  out_features: str | None = 'features'
  #: Where to read the input size of a layer Linen calls only inside a
  #: transform (an RNN cell): a kernel's path in its variables, axis 0.
  in_from_kernel: tuple[str, ...] | None = None
  #: Which argument of the call is the input whose size NNX takes (an RNN
  #: cell's is its second, after the carry).
  input_index: int = 0
  #: `(nnx variable, linen variables, pattern)`: Linen variables NNX holds
  #: side by side in one (a `converters.Rearrange` pattern; the parts in the
  #: order of its part axis).
  fused_variables: tuple[tuple[str, tuple[str, ...], str], ...] = ()
  #: Linen variable names NNX spells otherwise (`if` is a keyword).
  variable_renames: tuple[tuple[str, str], ...] = ()
  #: Linen fields holding a module, and the NNX attribute that holds its port.
  module_fields: tuple[tuple[str, str], ...] = ()
  #: The Linen field holding a list of modules and functions that NNX takes
  #: one by one as its positional arguments and holds in the list of that
  #: name (`nn.Sequential([...])` is `nnx.Sequential(...)`, `layers`).
  sequence_field: str | None = None
  #: The NNX argument taking the size of the key and value inputs where a
  #: call gives them besides the query (attention's `in_kv_features`: NNX
  #: takes them to be the query's size otherwise); None: one input.
  kv_features: str | None = None
  #: Linen fields whose default NNX does not share (attention's `decode`:
  #: False in Linen, None in NNX, which then wants it at every call):
  #: written out with Linen's default where the creation leaves them.
  linen_defaults: tuple[str, ...] = ()
  #: The class the port writes for a user's subclass of the layer
  #: (`StdConv`, `layer_subclasses`), which is built as the layer is; None
  #: for Flax's own.
  subclass: str | None = None

  @property
  def written(self) -> str:
    """The class a port's creation names: the subclass, else the NNX layer."""
    return self.subclass or self.nnx

  def linen_default(self, field: str):
    return next(f.default for f in dataclasses.fields(self.linen) if f.name == field)

  @property
  def nnx_class(self) -> type:
    return getattr(nnx, self.nnx.removeprefix('nnx.'))

  def nnx_argument(self, field: str) -> str:
    return dict(self.renames).get(field, field)

  def nnx_positional(self) -> list[str]:
    """The NNX constructor's parameters that may be given by position."""
    return [
        name for name, p in list(inspect.signature(self.nnx_class.__init__).parameters.items())[1:]
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]

  def in_features_first(self) -> bool:
    """Whether NNX takes the input size as its first argument (`Linear`),
    rather than after others (`MultiHeadAttention(num_heads, in_features)`)."""
    return self.in_features is not None and self.nnx_positional()[:1] == [self.in_features]

  def nnx_parameters(self) -> list[str]:
    """The NNX constructor's parameters, in order (`self` left out)."""
    return list(inspect.signature(self.nnx_class.__init__).parameters)[1:]


LAYERS: tuple[LayerSpec, ...] = (
    LayerSpec(nn.Dense, 'nnx.Linear', 'in_features', renames=(('features', 'out_features'),)),
    LayerSpec(nn.Conv, 'nnx.Conv', 'in_features', renames=(('features', 'out_features'),)),
    LayerSpec(nn.ConvTranspose, 'nnx.ConvTranspose', 'in_features', renames=(('features', 'out_features'),)),
    LayerSpec(nn.Embed, 'nnx.Embed'),
    LayerSpec(nn.LayerNorm, 'nnx.LayerNorm', 'num_features', out_features=None),
    LayerSpec(nn.RMSNorm, 'nnx.RMSNorm', 'num_features', out_features=None),
    LayerSpec(nn.GroupNorm, 'nnx.GroupNorm', 'num_features', out_features=None),
    LayerSpec(
        nn.BatchNorm, 'nnx.BatchNorm', 'num_features', mode=(('use_running_average', True),),
        out_features=None,
    ),
    LayerSpec(nn.Dropout, 'nnx.Dropout', mode=(('deterministic', True),), out_features=None),
    LayerSpec(
        nn.LSTMCell, 'nnx.LSTMCell', 'in_features', renames=(('features', 'hidden_features'),),
        in_from_kernel=('ii', 'kernel'), input_index=1, variable_renames=(('if', 'if_'),),
    ),
    # Linen's OptimizedLSTMCell has LSTMCell's parameters and computes the
    # four gates with one product of their kernels side by side (i, f, g, o),
    # as NNX's holds them: the same program.
    LayerSpec(
        nn.OptimizedLSTMCell, 'nnx.OptimizedLSTMCell', 'in_features',
        renames=(('features', 'hidden_features'),), in_from_kernel=('ii', 'kernel'), input_index=1,
        fused_variables=(
            ('dense_i/kernel', tuple(f'i{g}/kernel' for g in 'ifgo'), 'i h -> i (gate h)'),
            ('dense_h/kernel', tuple(f'h{g}/kernel' for g in 'ifgo'), 'i h -> i (gate h)'),
            ('dense_h/bias', tuple(f'h{g}/bias' for g in 'ifgo'), 'h -> (gate h)'),
        ),
    ),
    LayerSpec(nn.RNN, 'nnx.RNN', out_features=None, module_fields=(('cell', 'cell'),)),
    LayerSpec(nn.Sequential, 'nnx.Sequential', out_features=None, rngs=False, sequence_field='layers'),
    LayerSpec(
        nn.MultiHeadDotProductAttention, 'nnx.MultiHeadAttention', 'in_features',
        mode=(('deterministic', True),), out_features='out_features', kv_features='in_kv_features',
        linen_defaults=('decode',),
    ),
)

_BY_CLASS = {spec.linen: spec for spec in LAYERS}


def feature_axis(module) -> int | None:
  """The input axis whose size the NNX layer takes (`axis` of a BatchNorm,
  `feature_axes` of the other norms, the last for the rest), or None if
  there are several."""
  axes = getattr(module, 'axis', None) if isinstance(module, nn.BatchNorm) else getattr(
      module, 'feature_axes', -1)
  if isinstance(axes, tuple):
    if len(axes) != 1:
      return None
    (axes,) = axes
  return axes if isinstance(axes, int) else None


def layer_spec(cls: type) -> LayerSpec | None:
  """The spec of Flax layer class `cls`, or None if it is not one the port
  knows. A user's class subclassing one directly with the same fields (and
  defaults) and no `__call__` or `setup` of its own (`StdConv(nn.Conv)` overriding `param`)
  has that layer's spec, written as its own class (`LayerSpec.subclass`)."""
  spec = _BY_CLASS.get(cls)
  if spec is not None or not isinstance(cls, type) or is_flax_class(cls) or len(cls.__bases__) != 1:
    return spec
  (base,) = cls.__bases__
  if base not in _BY_CLASS or {'__call__', 'setup'} & vars(cls).keys():
    return None
  ours, theirs = dataclasses.fields(cls), dataclasses.fields(base)
  if [(f.name, f.default, f.default_factory) for f in ours] != [
      (f.name, f.default, f.default_factory) for f in theirs]:
    return None  # fields or defaults of its own: its constructor is not the layer's
  return dataclasses.replace(_BY_CLASS[base], linen=cls, subclass=cls.__name__)


def is_flax_class(cls: type) -> bool:
  """Whether `cls` is one of Flax's own modules (known to the port or not)."""
  return cls.__module__.startswith('flax.')
